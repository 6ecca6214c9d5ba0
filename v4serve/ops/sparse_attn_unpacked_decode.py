"""Decode over packed KV rows by unpacking each query's columns first, then the bf16 kernels
(a comparison route for issue 17: `tile_config=dict(KERNEL="unpack")`; production dequantizes in
the attention kernels, sparse_attn_triton.py).

Math: the attention of sparse_attn_reference.py over the packed rows' values. The route
gathers, for every query token t and column c < C of idx [T, C] (column c < n_window names a
win_pool row, the rest cmp_pool rows, -1 = a hole; columns >= n_window + counts[t] count as holes),
the packed row the column names and writes it unpacked to a per-step scratch pool in column order:

    rows[t * C + c] = unpack(pool_of(c)[idx[t, c]])     bf16 [T * C, D]   (zero for holes)
    cols[t, c]      = t * C + c if the column is live, else -1          int32 [T, C]

then runs the production bf16 decode launch (split-K for one token, two-pass from two) over
(rows, cols): the same values in the same column order, so the output has the bits of the bf16
launch over the unpacked pools. Sizes come from the shapes (T, C), so the route has no host sync
and captures in a CUDA graph; its cost is one extra launch and T * C * (592 + 1024) bytes of
traffic (r4 B8: 8.3 MB).

Kernel `_unpack_columns_kernel`, grid (T, cdiv(C, BLOCK_C)): BLOCK_C columns of one token per
program, their packed rows read as 16-byte code / tail loads and int32 scale words
(kv_pack_triton.load_packed), the unpacked rows written as 16-byte stores.
"""

import torch
import triton
import triton.language as tl

from v4serve.ops.kv_pack_triton import load_packed
from v4serve.ops.sparse_attn_tiles import column_bound, load_rows, row_pointers

BLOCK_C = 16
_PK_LOAD = ("PK_NQ", "PK_BLOCK", "PK_TAIL_OFF", "PK_SCALE_OFF", "PK_HAS_TAIL", "PK_FP8_CVT")


@triton.jit
def _unpack_columns_kernel(
    win_ptr, cmp_ptr, idx_ptr, counts_ptr, rows_ptr, cols_ptr,
    C, D, n_window, stride_pool, stride_it, stride_rows, stride_ct,
    HAS_COUNTS: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr, PK_NQ: tl.constexpr,
    PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr,
    PK_FP8_CVT: tl.constexpr = False,
):
    tok = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    hi = column_bound(counts_ptr, tok, C, n_window, HAS_COUNTS)
    rows = load_rows(idx_ptr, tok, stride_it, cols, hi)
    live = rows >= 0
    kv = load_packed(row_pointers(win_ptr, cmp_ptr, rows, cols, n_window, stride_pool), live, 0, D, BLOCK_D, PK_NQ,
                     PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, tl.bfloat16, PK_FP8_CVT)
    slot = tok * C + cols
    dims = tl.arange(0, BLOCK_D)
    in_c = cols < C
    tl.store(rows_ptr + slot[:, None] * stride_rows + dims[None, :], kv, mask=in_c[:, None] & (dims < D)[None, :])
    tl.store(cols_ptr + tok * stride_ct + cols, tl.where(live, slot, -1).to(tl.int32), mask=in_c)


def unpack_columns(win, cmp, it, ct, n_window, D, pk, has_counts):
    """(rows [T * C, D] bf16, cols [T, C] int32) as above, for [T, C] views as sparse_attn_triton.py
    prepares them; pk: the packed format's PK_* constexprs (kv_pack_triton.packed_constexprs)."""
    T, C = it.shape
    rows = torch.empty(T * C, D, dtype=torch.bfloat16, device=it.device)
    cols = torch.empty(T, C, dtype=torch.int32, device=it.device)
    if T * C == 0:
        return rows, cols
    _unpack_columns_kernel[(T, triton.cdiv(C, BLOCK_C))](
        win, cmp, it, ct, rows, cols,
        C, D, n_window, win.stride(0), it.stride(0), rows.stride(0), cols.stride(0),
        HAS_COUNTS=has_counts, BLOCK_C=BLOCK_C, BLOCK_D=max(16, triton.next_power_of_2(D)), num_warps=4,
        **{k: v for k, v in pk.items() if k in _PK_LOAD},
    )
    return rows, cols
