"""Paged sparse attention of DeepSeek-V4: public entry point.

Math: v4serve/ops/sparse_attn_reference.py. Kernels: prefill (M > 1) and decode
(M == 1: split-K plus merge for one token, the two-pass kernels from 2) behind
sparse_attn_triton.py. bf16 inputs on CUDA run the kernels; anything else runs
the reference.
"""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.sparse_attn_reference import sparse_attn_paged_reference
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton


def _check_args(q, win_pool, cmp_pool, idx, n_window, sink, counts):
    if q.dim() != 4:
        raise ValueError(f"q must be [B, M, H, D], got shape {tuple(q.shape)}")
    B, M, H, D = q.shape
    for name, pool in (("win_pool", win_pool), ("cmp_pool", cmp_pool)):
        if pool.dim() != 2 or pool.shape[1] != D:
            raise ValueError(f"{name} must be [N, {D}], got shape {tuple(pool.shape)}")
        if pool.dtype != win_pool.dtype:
            raise ValueError(f"win_pool and cmp_pool must share a dtype, got {win_pool.dtype} and {pool.dtype}")
    if idx.dtype != torch.int32 or idx.dim() != 3 or tuple(idx.shape[:2]) != (B, M):
        raise ValueError(f"idx must be int32 [{B}, {M}, n_window + K], got {idx.dtype} {tuple(idx.shape)}")
    if not 0 <= n_window <= idx.shape[2]:
        raise ValueError(f"n_window must be in [0, {idx.shape[2]}], got {n_window}")
    if sink.shape != (H,):
        raise ValueError(f"sink must be [{H}], got shape {tuple(sink.shape)}")
    if counts is not None and (counts.dtype != torch.int32 or tuple(counts.shape) != (B, M)):
        raise ValueError(f"counts must be int32 [{B}, {M}], got {counts.dtype} {tuple(counts.shape)}")


def sparse_attn_paged(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts=None, impl="auto"):
    """Attention of q [B, M, H, D] over the rows idx [B, M, n_window + K] names (-1 = hole).

    Columns < n_window index win_pool [N_w, D], the rest cmp_pool [N_c, D] (same dtype and row
    stride; views with a row offset are fine). sink [H] fp32 (finite) enters only the softmax
    denominator; counts [B, M] int32, when given, is the number of live compressed columns.
    Returns [B, M, H, D] in q.dtype; a query with no live column gets 0.
    """
    _check_args(q, win_pool, cmp_pool, idx, n_window, sink, counts)
    bf16 = q.dtype == win_pool.dtype == torch.bfloat16
    if use_triton(impl, q, win_pool, cmp_pool, idx) and (bf16 or impl == "triton"):
        if not bf16:
            raise ValueError(f"the Triton kernels take bf16 q and pools, got {q.dtype} and {win_pool.dtype}")
        return sparse_attn_paged_triton(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts)
    return sparse_attn_paged_reference(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts)
