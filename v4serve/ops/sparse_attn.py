"""Paged sparse attention of DeepSeek-V4: public entry point.

Math: v4serve/ops/sparse_attn_reference.py. Kernels: prefill (M > 1) and decode
(M == 1: split-K plus merge for one token, the two-pass kernels from 2) behind
sparse_attn_triton.py. bf16 inputs on CUDA run the kernels; anything else runs
the reference.

Packed pools: with `row_format` (a packed RowFormat of v4serve/formats.py, e.g.
"fp8_e8m0_b64_rope64"), win_pool and cmp_pool are uint8 [N, >= row_bytes(D)] and the decode
kernels gather the packed rows and dequantize them in registers; prefill unpacks each row it
references once, on the device (kv_compact.py), then runs the bf16 kernels (the reference
unpacks, then runs the bf16 math): the result equals attention over unpack_rows(pool) in bf16.
DeepSeek-V4.1's two formats (`cmp_row_format`: fp8_e8m0_b32 window rows, fp4_e4m3_b16 compressed
rows) run the same unpack-then-bf16 route for decode too (sparse_attn_two_formats_triton).
"""

import torch

from v4serve.formats import row_format as _row_format
from v4serve.ops._dispatch import use_triton
from v4serve.ops.kv_pack import check_pool
from v4serve.ops.sparse_attn_reference import sparse_attn_paged_reference
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton, sparse_attn_two_formats_triton


def _check_args(q, win_pool, cmp_pool, idx, n_window, sink, counts, fmt=None):
    if q.dim() != 4:
        raise ValueError(f"q must be [B, M, H, D], got shape {tuple(q.shape)}")
    B, M, H, D = q.shape
    for name, pool in (("win_pool", win_pool), ("cmp_pool", cmp_pool)):
        if fmt is not None:
            check_pool(name, pool, fmt, D)
            if pool.shape[1] != win_pool.shape[1]:
                raise ValueError(f"win_pool and cmp_pool must share a row width, got {win_pool.shape[1]} and "
                                 f"{pool.shape[1]}")
        elif pool.dim() != 2 or pool.shape[1] != D:
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


def sparse_attn_paged(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts=None, row_format=None, impl="auto",
                      cmp_row_format="same", unpack_bound=None):
    """Attention of q [B, M, H, D] over the rows idx [B, M, n_window + K] names (-1 = hole).

    Columns < n_window index win_pool [N_w, D], the rest cmp_pool [N_c, D] (same dtype and row
    stride; views with a row offset are fine). sink [H] fp32 (finite) enters only the softmax
    denominator; counts [B, M] int32, when given, is the number of live compressed columns.
    Returns [B, M, H, D] in q.dtype; a query with no live column gets 0. row_format (None or
    "bf16": pools hold values; a packed format: uint8 pools of that format's rows, see above).
    unpack_bound (packed rows, M > 1): at least the number of distinct rows idx names, known on the
    host (the step plan's); it sizes the pool the kernels unpack them into (ops/kv_compact.py).
    """
    fmt = None if row_format is None else _row_format(row_format)
    if fmt is not None and not fmt.packed:
        fmt = None
    if not (isinstance(cmp_row_format, str) and cmp_row_format == "same"):
        cmp_fmt = None if cmp_row_format is None else _row_format(cmp_row_format)
        cmp_fmt = cmp_fmt if cmp_fmt is not None and cmp_fmt.packed else None
        if cmp_fmt != fmt:  # V4.1: window and compressed rows in two formats
            return _mixed_formats(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts, fmt, cmp_fmt, impl,
                                  unpack_bound)
    _check_args(q, win_pool, cmp_pool, idx, n_window, sink, counts, fmt)
    if fmt is not None:
        if use_triton(impl, q, win_pool, cmp_pool, idx) and (q.dtype == torch.bfloat16 or impl == "triton"):
            if q.dtype != torch.bfloat16:
                raise ValueError(f"the Triton kernels take bf16 q, got {q.dtype}")
            return sparse_attn_paged_triton(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts,
                                            row_format=fmt, unpack_bound=unpack_bound)
        return sparse_attn_paged_reference(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts, fmt)
    bf16 = q.dtype == win_pool.dtype == torch.bfloat16
    if use_triton(impl, q, win_pool, cmp_pool, idx) and (bf16 or impl == "triton"):
        if not bf16:
            raise ValueError(f"the Triton kernels take bf16 q and pools, got {q.dtype} and {win_pool.dtype}")
        return sparse_attn_paged_triton(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts)
    return sparse_attn_paged_reference(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts)


def _mixed_formats(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts, fmt, cmp_fmt, impl, unpack_bound):
    """Window rows in `fmt`, compressed rows in `cmp_fmt` (either None: plain rows of D values).
    Two packed formats (DeepSeek-V4.1) run the Triton route of sparse_attn_two_formats_triton."""
    B, M, H, D = q.shape
    for name, pool, f in (("win_pool", win_pool, fmt), ("cmp_pool", cmp_pool, cmp_fmt)):
        if f is not None:
            check_pool(name, pool, f, D)
        elif pool.dim() != 2 or pool.shape[1] != D:
            raise ValueError(f"{name} must be [N, {D}], got shape {tuple(pool.shape)}")
    if fmt is not None and cmp_fmt is not None and use_triton(impl, q, win_pool, cmp_pool, idx):
        return sparse_attn_two_formats_triton(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts, fmt, cmp_fmt,
                                              unpack_bound)
    if impl == "triton":
        raise NotImplementedError("sparse attention over one packed pool and one plain pool has no Triton kernel")
    return sparse_attn_paged_reference(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts, fmt, cmp_fmt)
