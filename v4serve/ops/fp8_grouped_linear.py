"""Grouped FP8 projection z[t, g] = W[g] x[t, g] (the attention's `o_a_proj`): public entry point.

    fp8_grouped_linear(x [T, G, I], weight e4m3 [G*R, I], scale, block, impl, route) -> z [T, G, R]

Math and layouts: fp8_grouped_linear_reference.py (weight-only numerics always: the official code
dequantizes wo_a to bf16 and multiplies in bf16, so no activation quantization here). There is no
kernel of its own; the Triton path runs `fp8_linear` (fp8_linear_triton.py) one of two ways:

  "blockdiag": ONE fp8_linear over all T*G rows against the whole weight ([T*G, I] x [I, G*R]):
      the G x G blocks of the product of which only the diagonal ones are kept (strided view
      [:, :: G + 1] of [T, G*G, R], copied out by the caller's flatten). The weight (32 MB at
      V4-Flash) is read once; the G-fold MMA waste is free while the decode tiles are
      bandwidth-bound (T*G <= 16 rows: the decode tiles' BLOCK_M), and grows as T*G*G*R*I later.
  "groups": G fp8_linear calls, group g's rows [T, I] (a row-strided view of x) against its R
      weight rows and their block scales (R % bn == 0: whole scale blocks), stacked to [T, G, R]:
      no wasted MMA work, G launches and one stack copy.
  "auto": blockdiag while T*G <= `blockdiag_max_rows` (BLOCKDIAG_MAX_ROWS), groups beyond.

The torch path (CPU) is the reference: the weight dequantized on the fly, one fp32 einsum.
Each fp32 sum differs from the reference's only in order; the results are rounded to x.dtype once.
"""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.fp8_grouped_linear_reference import fp8_grouped_linear_reference
from v4serve.ops.fp8_linear import fp8_linear
from v4serve.ops.weight_formats import check_fp8_weight

# Rows (T * G) up to which one block-diagonal GEMM runs (V4-Flash, G = 8: up to 8 tokens): the weight
# is read once, the discarded blocks' MMA work grows with T. Measured on the H200 at Flash's shape
# (session 16, `bench kernels --only 'o_a '`, µs, blockdiag vs groups): T1 14.41 vs 37.95, T4 19.15
# vs 40.27, T8 31.86 vs 39.35 (T64: groups 72.1).
BLOCKDIAG_MAX_ROWS = 64
ROUTES = ("auto", "blockdiag", "groups")


def groups_are_whole_blocks(rows_per_group: int, block: tuple[int, int]) -> bool:
    """A group's weight rows are whole scale blocks: the "groups" route can slice its scales, and a
    tensor-parallel cut by groups falls on block edges."""
    return rows_per_group % block[0] == 0


def _check(x, weight, scale, block, route):
    check_fp8_weight(weight, scale, tuple(block))
    if x.dim() != 3 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x must be [T, G, I] with I = weight's {weight.shape[1]}, got {list(x.shape)}")
    if x.shape[1] == 0 or weight.shape[0] % x.shape[1]:
        raise ValueError(f"weight rows ({weight.shape[0]}) must be G = {x.shape[1]} groups of equal size")
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")


def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block=(128, 128),
                       impl: str = "auto", route: str = "auto", arrivals: torch.Tensor | None = None,
                       blockdiag_max_rows: int = BLOCKDIAG_MAX_ROWS) -> torch.Tensor:
    """z [T, G, R] = x[:, g] @ W[g]^T per group (module docstring). `arrivals`: fp8_linear's split
    counters (int32 zeros [>= ceil(G*R / 64)], left at zero by every launch), shared by the calls."""
    block = tuple(block)
    _check(x, weight, scale, block, route)
    if not use_triton(impl, x, weight, scale):
        return fp8_grouped_linear_reference(x, weight, scale, block)
    t, g, i = x.shape
    r = weight.shape[0] // g
    if route == "auto":
        route = "blockdiag" if t * g <= blockdiag_max_rows else "groups"
    if route == "blockdiag":
        full = fp8_linear(x.reshape(t * g, i), weight, scale, block, impl=impl, arrivals=arrivals)
        return full.view(t, g * g, r)[:, :: g + 1]  # row (t, g) against group g's columns
    if not groups_are_whole_blocks(r, block):
        raise ValueError(f"route 'groups' needs each group's {r} weight rows to be whole scale blocks of {block[0]}")
    per_block = r // block[0]
    return torch.stack([
        fp8_linear(x[:, j], weight[j * r:(j + 1) * r], scale[j * per_block:(j + 1) * per_block], block, impl=impl,
                   arrivals=arrivals)
        for j in range(g)], dim=1)
