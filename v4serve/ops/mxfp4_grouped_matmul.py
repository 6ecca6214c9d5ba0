"""MXFP4 (W4A16) MoE grouped matmul: public entry point (math in mxfp4_grouped_matmul_reference.py,
kernel in mxfp4_grouped_matmul_triton.py). Same contract as `grouped_matmul` with the expert
weights kept packed, and optionally the experts' clamped SwiGLU applied to the two halves of the
output (the fused gate_up projection); group sizes never leave the device on the Triton path.

Two Triton kernels: the GEMV (mxfp4_gemv_triton.py: each weight decoded once in registers, an FMA
chain per pick) where experts average few picks (decode), the tensor-core one
(mxfp4_grouped_matmul_triton.py) elsewhere; `gemv_picks` chooses from the shapes alone."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.mxfp4_grouped_matmul_reference import mxfp4_grouped_matmul_reference
from v4serve.ops.mxfp4_gemv_triton import gemv_picks, mxfp4_gemv_triton
from v4serve.ops.mxfp4_grouped_matmul_triton import mxfp4_config, mxfp4_grouped_matmul_triton
from v4serve.ops.swiglu_reference import clamped_swiglu_reference
from v4serve.ops.weight_formats import check_mxfp4_weight


def mxfp4_grouped_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor | None,
                         ends: torch.Tensor, impl: str = "auto", tile_experts: int | None = None,
                         swiglu_limit: float | None = None) -> torch.Tensor:
    """y [M, N] with y[m] = x[rows[m]] @ W[g(m)]^T, picks sorted by group g.

    x [T, K] (bf16 / fp16 / fp32); weight uint8 [E, N, K/2] packed e2m1; scale uint8 ue8m0
    [E, N, K/32]; rows [M] int64, or None for rows[m] = m (M = T); ends [E] int32, the cumulative
    ends of the groups (group e owns picks ends[e-1] .. ends[e] - 1). y in x.dtype. Picks at or
    past ends[E-1] belong to no group: their rows of y are left undefined (uninitialised on the
    Triton path, zero on the torch path).

    `swiglu_limit` L (the experts' gate_up projection, W's rows = [gate; up]): y [M, N/2] =
    `clamped_swiglu(gate, up, L)` of the two halves of x W^T (each rounded to x.dtype first), in
    one kernel on the Triton path.

    `tile_experts` (default E): the expert count the Triton kernel and tile choice is made for
    (`gemv_picks`, `mxfp4_config`). A row of y depends only on its group's picks and on the tiles, so an
    `ExpertOffload`, whose weight tensor holds resident rows + slots instead of the layer's E
    experts, passes the layer's E to get the bits that the experts all resident would give.
    """
    check_mxfp4_weight(weight, scale)
    if x.dim() != 2 or weight.dim() != 3 or 2 * weight.shape[2] != x.shape[1]:
        raise ValueError(f"x must be [T, K] and weight [E, N, K/2], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if ends.dtype != torch.int32 or ends.shape != (weight.shape[0],):
        raise ValueError(f"ends must be int32 [{weight.shape[0]}], got {ends.dtype} {tuple(ends.shape)}")
    if x.stride(1) != 1 or weight.stride(2) != 1 or scale.stride(2) != 1:
        raise ValueError("x, weight and scale must have a unit stride along K")
    if swiglu_limit is not None and weight.shape[1] % 2:
        raise ValueError(f"swiglu_limit needs weight rows [gate; up] (an even N), got N = {weight.shape[1]}")
    n_picks = x.shape[0] if rows is None else rows.shape[0]
    if use_triton(impl, x, weight, scale, ends):
        picks = gemv_picks(n_picks, tile_experts or weight.shape[0])
        if picks is not None:
            return mxfp4_gemv_triton(x, weight.view(torch.uint8), scale, rows, ends, n_picks, picks,
                                     swiglu_limit=swiglu_limit)
        config = None if tile_experts is None else mxfp4_config(n_picks, tile_experts, swiglu_limit is not None)
        return mxfp4_grouped_matmul_triton(x, weight.view(torch.uint8), scale, rows, ends, n_picks, config,
                                           swiglu_limit)
    y = mxfp4_grouped_matmul_reference(x if rows is None else x[rows], weight.view(torch.uint8), scale, ends)
    if swiglu_limit is None:
        return y
    gate, up = y.chunk(2, dim=-1)
    return clamped_swiglu_reference(gate, up, swiglu_limit)
