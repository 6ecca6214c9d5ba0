"""Tile steps shared by the `tl` sparse-attention kernels (sparse_attn_triton.py, sparse_attn_decode_triton.py).

Layouts as in sparse_attn_triton.py: idx [T, C] int32 (column c < n_window names a win_pool row,
the rest cmp_pool rows, -1 = hole), counts [T] int32, both pools [N, D] bf16 sharing one 16-byte
aligned row stride; or both pools uint8 rows of a packed format (PACKED; the PK_* constexprs of
kv_pack_triton.packed_constexprs), dequantized to bf16 in registers by `load_packed`.
"""

import triton
import triton.language as tl

from v4serve.ops.kv_pack_triton import load_packed


@triton.jit
def column_bound(counts_ptr, tok, C, n_window, HAS_COUNTS: tl.constexpr):
    """End of token `tok`'s live columns: C, or n_window + counts[tok] when counts are given."""
    hi = C
    if HAS_COUNTS:
        hi = tl.minimum(hi, n_window + tl.maximum(tl.load(counts_ptr + tok), 0))
    return hi


@triton.jit
def split_width(bound, cols_per_split, wide_from, wide_cols_per_split):
    """Columns per split of a token whose live columns end at `bound`: the wide width past wide_from
    live columns (split-K decode: few serial tiles for a short context, few splits for a long one)."""
    return tl.where(bound > wide_from, wide_cols_per_split, cols_per_split)


@triton.jit
def load_rows(idx_ptr, tok, stride_it, cols, hi):
    """Pool rows token `tok`'s columns `cols` name: idx, with -1 (a hole) for columns >= hi."""
    return tl.load(idx_ptr + tok * stride_it + cols, mask=cols < hi, other=-1)


@triton.jit
def row_pointers(win_ptr, cmp_ptr, rows, cols, n_window, stride_pool):
    """Pointers to pool rows `rows` of columns `cols` (win_pool below n_window, cmp_pool above)."""
    # NOTE: the hint keeps the gather at 16-byte loads (Triton >= 3.8 loses the alignment of a select).
    base = tl.multiple_of(tl.where(cols < n_window, win_ptr, cmp_ptr), 16)
    return base + rows.to(tl.int64) * stride_pool


@triton.jit
def gather_kv_tile(win_ptr, cmp_ptr, idx_ptr, tok, stride_it, stride_pool, n_window, cols, hi, dims, dim_ok):
    """The KV rows of token `tok`'s columns `cols` at `dims` ([len(cols), len(dims)], zero for
    holes and for columns >= hi) and which columns are live."""
    rows = load_rows(idx_ptr, tok, stride_it, cols, hi)
    live = rows >= 0
    kv = tl.load(row_pointers(win_ptr, cmp_ptr, rows, cols, n_window, stride_pool)[:, None] + dims[None, :],
                 mask=live[:, None] & dim_ok[None, :], other=0.0)
    return kv, live


@triton.jit
def bf16_operand_boundary(kv, ON: tl.constexpr):
    """kv (a bf16 tile dequantized from packed rows) unchanged. ON: passed through an inline-asm
    identity (one 32-bit move per two values, which ptxas deletes) that Triton must treat as having
    side effects. Triton sizes an mma.sync operand's register layout by the narrowest load in the
    operand's elementwise history: through the dequantization it finds the 8-bit code loads and
    gives both dot operands kWidth 4 (the split-K decode kernel then loads Q and the tile with
    LDS.64 and moves ~230 registers a thread into place before its HMMAs: 844 SASS instructions a
    thread for the tile against 577 with the boundary, Triton 3.6 on sm_90). Behind the boundary
    the history starts at a bf16 value, so the operands get the bf16 kernel's kWidth 2 (ldmatrix,
    no moves) and the same k order inside each mma as the bf16 kernel. OFF in the interpreter
    (no inline asm there)."""
    if ON:
        return tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [kv], dtype=tl.bfloat16, is_pure=False, pack=2)
    return kv


@triton.jit
def gather_packed_kv_tile(win_ptr, cmp_ptr, idx_ptr, tok, stride_it, stride_pool, n_window, cols, hi, d0, D,
                          K: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr,
                          PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr, PK_FP8_CVT: tl.constexpr = False):
    """gather_kv_tile over packed rows: channels [d0, d0 + K) of token `tok`'s columns `cols` as
    bf16 [len(cols), K] (exactly the unpacked values; zero for holes and columns >= hi), and which
    columns are live."""
    rows = load_rows(idx_ptr, tok, stride_it, cols, hi)
    live = rows >= 0
    kv = load_packed(row_pointers(win_ptr, cmp_ptr, rows, cols, n_window, stride_pool), live, d0, D, K,
                     PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, tl.bfloat16, PK_FP8_CVT)
    return kv, live


@triton.jit
def sliced_scores(q_rows, head_ok, win_ptr, cmp_ptr, idx_ptr, tok, stride_it, stride_pool, n_window, cols, hi, D,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, QK_SLICE: tl.constexpr, PACKED: tl.constexpr,
                  PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr,
                  PK_HAS_TAIL: tl.constexpr, PK_FP8_CVT: tl.constexpr = False):
    """Q K^T of token `tok`'s columns `cols` (fp32 [BLOCK_H, len(cols)], unscaled) as a chain of
    dots over QK_SLICE-wide slices of the head dim, each K slice gathered (and, PACKED, dequantized)
    on its own and the Q slice re-read from q_rows (the heads' row pointers; L1 hits); then the
    whole KV tile ([len(cols), BLOCK_D] bf16, for P V) and which columns are live.

    S equals tl.dot(q, tl.trans(kv)) up to the order of the fp32 sums (on the H200 the chain rounds
    differently from one dot: the tests compare the two bit for bit on integer-valued inputs, where
    every partial sum is exact)."""
    rows = load_rows(idx_ptr, tok, stride_it, cols, hi)
    live = rows >= 0
    row_ptrs = row_pointers(win_ptr, cmp_ptr, rows, cols, n_window, stride_pool)
    s = tl.zeros([BLOCK_H, cols.shape[0]], dtype=tl.float32)
    for k in range(0, BLOCK_D, QK_SLICE):
        kd = k + tl.arange(0, QK_SLICE)
        q = tl.load(q_rows[:, None] + kd[None, :], mask=head_ok[:, None] & (kd < D)[None, :], other=0.0)
        if PACKED:
            kk = load_packed(row_ptrs, live, k, D, QK_SLICE, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                             tl.bfloat16, PK_FP8_CVT)
        else:
            kk = tl.load(row_ptrs[:, None] + kd[None, :], mask=live[:, None] & (kd < D)[None, :], other=0.0)
        s = tl.dot(q, tl.trans(kk), s)
    dims = tl.arange(0, BLOCK_D)
    if PACKED:
        kv = load_packed(row_ptrs, live, 0, D, BLOCK_D, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                         tl.bfloat16, PK_FP8_CVT)
    else:
        kv = tl.load(row_ptrs[:, None] + dims[None, :], mask=live[:, None] & (dims < D)[None, :], other=0.0)
    return s, kv, live
