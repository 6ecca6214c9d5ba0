"""Decode GEMV (y = x W^T for at most 8 rows, fp32 sums): public entry point (math in
decode_gemv_reference.py, kernel in decode_gemv_triton.py). The router's logits at decode."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.decode_gemv_reference import decode_gemv_reference
from v4serve.ops.decode_gemv_triton import MAX_ROWS, decode_gemv_triton


def decode_gemv(x: torch.Tensor, weight: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """x [T, K], weight [N, K] of one float dtype, T <= 8 -> y [T, N] in x's dtype."""
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[1] or x.dtype != weight.dtype:
        raise ValueError(f"x must be [T, K] and weight [N, K] of one dtype, got {x.dtype} {tuple(x.shape)} and "
                         f"{weight.dtype} {tuple(weight.shape)}")
    if x.shape[0] > MAX_ROWS:
        raise ValueError(f"the decode GEMV takes at most {MAX_ROWS} rows, got {x.shape[0]}")
    if use_triton(impl, x, weight):
        return decode_gemv_triton(x, weight)
    return decode_gemv_reference(x, weight)
