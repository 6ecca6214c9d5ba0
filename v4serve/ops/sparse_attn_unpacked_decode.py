"""Decode over packed KV rows by unpacking each query's columns first, then the bf16 kernels.
Production for DeepSeek-V4.1's decode, whose window rows (fp8_e8m0_b32, 528 B) and compressed rows
(fp4_e4m3_b16, 288 B) differ in format and row stride, so no single-format attention kernel reads
both; for V4 (one format) a comparison route (`tile_config=dict(KERNEL="unpack")`; V4's production
decode dequantizes inside the attention kernels, sparse_attn_triton.py).

Math: the attention of sparse_attn_reference.py over the packed rows' values. The route
gathers, for every query token t and column c < C of idx [T, C] (column c < n_window names a
win_pool row, the rest cmp_pool rows, -1 = a hole; columns >= n_window + counts[t] count as holes),
the packed row the column names and writes it unpacked to a per-step scratch pool in column order:

    rows[t * C + c] = unpack(pool_of(c)[idx[t, c]])     bf16 [T * C, D]   (zero for holes)
    cols[t, c]      = t * C + c if the column is live, else -1          int32 [T, C]

then runs the production bf16 decode launch (split-K for one token, two-pass from two) over
(rows, cols): the same values in the same column order, so the output has the bits of the bf16
launch over the unpacked pools. Sizes come from the shapes (T, C), so the route has no host sync
and captures in a CUDA graph; its cost is one extra launch and T * C * (row bytes + 1024) bytes of
traffic (V4 r4 B8: 8.3 MB; V4.1 B1, 128 window + 512 compressed columns: 1.0 MB).

Kernel `_unpack_columns_kernel`, grid (T, cdiv(C, BLOCK_C)): BLOCK_C columns of one token per
program, each pool's rows decoded by its own format's constexprs (W_* window, C_* compressed:
kv_pack_fp4_e4m3_triton.load_row_values; a tile holding no column of a pool skips that pool),
codes as 16-byte loads, scales as int32 words or 16-byte loads, the unpacked rows written as
16-byte stores.
"""

import torch
import triton
import triton.language as tl

from v4serve.ops.kv_pack_fp4_e4m3_triton import load_row_values, row_block_d
from v4serve.ops.kv_compact_triton import pool_constexprs
from v4serve.ops.sparse_attn_tiles import column_bound, load_rows

BLOCK_C = 16


@triton.jit
def _unpack_columns_kernel(
    win_ptr, cmp_ptr, idx_ptr, counts_ptr, rows_ptr, cols_ptr,
    C, D, n_window, stride_win, stride_cmp, stride_it, stride_rows, stride_ct,
    HAS_COUNTS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr,
    W_FP4_E4M3: tl.constexpr, W_NQ: tl.constexpr, W_BLOCK: tl.constexpr, W_TAIL_OFF: tl.constexpr,
    W_SCALE_OFF: tl.constexpr, W_HAS_TAIL: tl.constexpr,
    C_FP4_E4M3: tl.constexpr, C_NQ: tl.constexpr, C_BLOCK: tl.constexpr, C_TAIL_OFF: tl.constexpr,
    C_SCALE_OFF: tl.constexpr, C_HAS_TAIL: tl.constexpr,
    FP8_CVT: tl.constexpr = False,
):
    tok = tl.program_id(0).to(tl.int64)
    first = tl.program_id(1) * BLOCK_C
    cols = first + tl.arange(0, BLOCK_C)
    hi = column_bound(counts_ptr, tok, C, n_window, HAS_COUNTS)
    rows = load_rows(idx_ptr, tok, stride_it, cols, hi)
    live = rows >= 0
    in_window = cols < n_window
    kv = tl.zeros([BLOCK_C, BLOCK_D], dtype=tl.bfloat16)
    if first < n_window:
        kv = load_row_values(win_ptr + rows.to(tl.int64) * stride_win, live & in_window, D, BLOCK_D, W_FP4_E4M3,
                             W_NQ, W_BLOCK, W_TAIL_OFF, W_SCALE_OFF, W_HAS_TAIL, tl.bfloat16, FP8_CVT)
    if first + BLOCK_C > n_window:
        compressed = load_row_values(cmp_ptr + rows.to(tl.int64) * stride_cmp, live & ~in_window, D, BLOCK_D,
                                     C_FP4_E4M3, C_NQ, C_BLOCK, C_TAIL_OFF, C_SCALE_OFF, C_HAS_TAIL, tl.bfloat16,
                                     FP8_CVT)
        kv = tl.where(in_window[:, None], kv, compressed)
    slot = tok * C + cols
    dims = tl.arange(0, BLOCK_D)
    in_c = cols < C
    tl.store(rows_ptr + slot[:, None] * stride_rows + dims[None, :], kv, mask=in_c[:, None] & (dims < D)[None, :])
    tl.store(cols_ptr + tok * stride_ct + cols, tl.where(live, slot, -1).to(tl.int32), mask=in_c)


def unpack_columns(win, cmp, it, ct, n_window, D, has_counts, win_fmt, cmp_fmt=None, fp8_cvt=False):
    """(rows [T * C, D] bf16, cols [T, C] int32) as above, for [T, C] views as sparse_attn_triton.py
    prepares them; window rows in the packed format `win_fmt`, compressed rows in `cmp_fmt` (None:
    `win_fmt`); fp8_cvt: the hardware e4m3 conversion for fp8 rows (sm_89+)."""
    cmp_fmt = win_fmt if cmp_fmt is None else cmp_fmt
    T, C = it.shape
    rows = torch.empty(T * C, D, dtype=torch.bfloat16, device=it.device)
    cols = torch.empty(T, C, dtype=torch.int32, device=it.device)
    if T * C == 0:
        return rows, cols
    _unpack_columns_kernel[(T, triton.cdiv(C, BLOCK_C))](
        win, cmp, it, ct, rows, cols,
        C, D, n_window, win.stride(0), cmp.stride(0), it.stride(0), rows.stride(0), cols.stride(0),
        HAS_COUNTS=has_counts, BLOCK_C=BLOCK_C, BLOCK_D=max(row_block_d(win_fmt, D), row_block_d(cmp_fmt, D)),
        num_warps=4, FP8_CVT=fp8_cvt, **pool_constexprs("W_", win_fmt, D), **pool_constexprs("C_", cmp_fmt, D),
    )
    return rows, cols
