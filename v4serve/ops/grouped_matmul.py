"""MoE grouped matmul: public entry point (math in grouped_matmul_reference.py, kernel in
grouped_matmul_triton.py). Group sizes never leave the device: decode can be graph-captured."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.grouped_matmul_reference import grouped_matmul_reference
from v4serve.ops.grouped_matmul_triton import grouped_matmul_triton


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor | None, ends: torch.Tensor, impl="auto"):
    """y [M, N] with y[m] = x[rows[m]] @ weight[g(m)]^T, picks sorted by group g.

    x [T, K]; weight [E, N, K]; rows [M] int64, or None for rows[m] = m (M = T); ends [E] int32,
    the cumulative ends of the groups (group e owns picks ends[e-1] .. ends[e] - 1).
    """
    if x.dim() != 2 or weight.dim() != 3 or weight.shape[2] != x.shape[1]:
        raise ValueError(f"x must be [T, K] and weight [E, N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if ends.dtype != torch.int32 or ends.shape != (weight.shape[0],):
        raise ValueError(f"ends must be int32 [{weight.shape[0]}], got {ends.dtype} {tuple(ends.shape)}")
    if x.stride(1) != 1 or weight.stride(2) != 1:
        raise ValueError("x and weight must have a unit stride along K")
    n_picks = x.shape[0] if rows is None else rows.shape[0]
    if use_triton(impl, x, weight, ends):
        return grouped_matmul_triton(x, weight, rows, ends, n_picks)
    return grouped_matmul_reference(x if rows is None else x[rows], weight, ends)
