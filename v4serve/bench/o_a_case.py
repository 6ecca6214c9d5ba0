"""Benchmark rows of the attention's grouped output projection at V4-Flash's shape (G 8 groups of
R 1024 rows over I 4096 channels; `bench kernels --only 'o_a '`), each as the attention runs it,
the [T, G*R] input of o_b_proj included (a copy where the route leaves a strided view):

* `o_a bf16 einsum T{T}`: the weight dequantized at load (64 MB bf16), one cuBLAS batched einsum:
  the path before, and still the one where a group is not whole scale blocks;
* `o_a fp8 blockdiag T{T}`: the FP8 weight (32 MB) through ONE `fp8_linear` over the T*G group rows,
  the diagonal blocks kept (`ops/fp8_grouped_linear.py`; production up to T*G = 16 rows);
* `o_a fp8 groups T{T}`: one `fp8_linear` a group (8 launches) and the stack (production beyond).

FLOPs are the useful ones (2 T G R I); the block-diagonal route multiplies G times as many.
"""

import torch

from v4serve.ops.fp8_grouped_linear import fp8_grouped_linear

O_GROUPS, O_RANK, O_IN = 8, 1024, 64 * 512 // 8
BLOCK = (128, 128)


def o_a_shapes() -> dict:
    shapes = {}
    for t in (1, 2, 4, 8, 64, 2048):
        shapes[f"o_a bf16 einsum T{t}"] = ("o_a", ("einsum", t))
    for t in (1, 2, 4, 8):
        shapes[f"o_a fp8 blockdiag T{t}"] = ("o_a", ("blockdiag", t))
    for t in (1, 2, 4, 8, 64, 2048):
        shapes[f"o_a fp8 groups T{t}"] = ("o_a", ("groups", t))
    return shapes


def build_o_a(route: str, t: int, device, seed: int = 0):
    """-> (fn, bytes, flops, bytes of one input set)."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, O_GROUPS, O_IN, generator=g, device=device).bfloat16()
    flops = 2 * t * O_GROUPS * O_RANK * O_IN
    io = 2 * x.numel() + 2 * t * O_GROUPS * O_RANK
    if route == "einsum":
        w = (torch.randn(O_GROUPS, O_RANK, O_IN, generator=g, device=device) * 0.02).bfloat16()
        nbytes = 2 * w.numel() + io
        return (lambda: torch.einsum("tgi,goi->tgo", x, w).flatten(1)), nbytes, flops, nbytes
    w = (torch.randn(O_GROUPS * O_RANK, O_IN, generator=g, device=device) * 16).to(torch.float8_e4m3fn)
    scale = torch.exp2(torch.randint(-14, -8, (O_GROUPS * O_RANK // BLOCK[0], O_IN // BLOCK[1]), generator=g,
                                     device=device).float())
    arrivals = torch.zeros(O_GROUPS * O_RANK // 64, dtype=torch.int32, device=device)  # as FP8GroupedLinear keeps
    nbytes = w.numel() + 4 * scale.numel() + io
    return (lambda: fp8_grouped_linear(x, w, scale, BLOCK, route=route, arrivals=arrivals).flatten(1)), nbytes, \
        flops, nbytes
