"""Gated pool of the DeepSeek-V4 KV compressor: public entry point (math in gated_pool_reference.py,
kernel in gated_pool_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.gated_pool_reference import gated_pool_reference
from v4serve.ops.gated_pool_triton import gated_pool_triton


def gated_pool(kv: torch.Tensor, score: torch.Tensor, out_dtype: torch.dtype | None = None, impl="auto"):
    """out[b, d] = sum_r kv[b, r, d] * softmax_r(score[b, :, d]) in fp32, for kv, score [B, R, D].

    Any strides. -inf scores weigh 0; a column whose scores are all -inf is a caller error (NaN).
    out_dtype defaults to kv.dtype.
    """
    if kv.dim() != 3 or kv.shape != score.shape:
        raise ValueError(f"kv and score must both be [B, R, D], got {tuple(kv.shape)} and {tuple(score.shape)}")
    out_dtype = kv.dtype if out_dtype is None else out_dtype
    if use_triton(impl, kv, score):
        return gated_pool_triton(kv, score, out_dtype)
    return gated_pool_reference(kv, score, out_dtype)
