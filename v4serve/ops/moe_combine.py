"""MoE combine (weighted un-sort and sum over a token's picks): public entry point (math in
moe_combine_reference.py, kernel in moe_combine_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.moe_combine_reference import moe_combine_reference
from v4serve.ops.moe_combine_triton import moe_combine_triton


def moe_combine(y: torch.Tensor, pos: torch.Tensor | None, weights: torch.Tensor, add: torch.Tensor | None = None,
                impl="auto") -> torch.Tensor:
    """out [T, D] in y.dtype: out[t] = sum_i weights[t, i] y[pos[t*k + i]] (fp32), plus `add` [T, D]
    (same dtype) when given. y [P, D] sorted picks, pos [P] int64 (None: y is in pick order,
    pos[p] = p), weights [T, k] fp32, P = T * k."""
    pos_ok = pos is None or pos.shape == (weights.numel(),)
    if y.dim() != 2 or weights.dim() != 2 or not pos_ok or y.shape[0] != weights.numel():
        raise ValueError(f"y must be [T*k, D], pos [T*k] and weights [T, k], got {tuple(y.shape)}, "
                         f"{None if pos is None else tuple(pos.shape)} and {tuple(weights.shape)}")
    if add is not None and (add.shape != (weights.shape[0], y.shape[1]) or add.dtype != y.dtype):
        raise ValueError(f"add must be [{weights.shape[0]}, {y.shape[1]}] {y.dtype}, got {add.dtype} {tuple(add.shape)}")
    if use_triton(impl, y, weights):
        return moe_combine_triton(y, pos, weights, add)
    return moe_combine_reference(y, pos, weights, add)
