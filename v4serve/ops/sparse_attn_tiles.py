"""Tile steps shared by the `tl` sparse-attention kernels (sparse_attn_triton.py, sparse_attn_decode_triton.py).

Layouts as in sparse_attn_triton.py: idx [T, C] int32 (column c < n_window names a win_pool row,
the rest cmp_pool rows, -1 = hole), counts [T] int32, both pools [N, D] bf16 sharing one 16-byte
aligned row stride; or both pools uint8 rows of a packed format (PACKED; the PK_* constexprs of
kv_pack_triton.packed_constexprs), dequantized to bf16 in registers by `load_packed`, or, for
S only, read as fp16 codes whose block scales multiply the partial scores (`scores_scales_after`).
"""

import triton
import triton.language as tl

from v4serve.ops.kv_pack_triton import code_unit, load_block_scale, load_codes_fp16, load_packed
from v4serve.ops.kv_quant_triton import _pow2


@triton.jit
def column_bound(counts_ptr, tok, C, n_window, HAS_COUNTS: tl.constexpr):
    """End of token `tok`'s live columns: C, or n_window + counts[tok] when counts are given."""
    hi = C
    if HAS_COUNTS:
        hi = tl.minimum(hi, n_window + tl.maximum(tl.load(counts_ptr + tok), 0))
    return hi


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


@triton.jit
def scores_scales_after(q_rows, head_ok, row_ptrs, live, D, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK_D: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr,
                        PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr,
                        PK_FP8_CVT: tl.constexpr):
    """S = Q K^T (fp32 [BLOCK_H, BLOCK_T], unscaled) over packed fp8 rows with the block scales
    applied to the partial scores instead of the tile (SCALES_AFTER):

        S[h, c] = 2^-e_h * sum_g 2^(b_cg - 127) * (q'_g[h] . decode(code_cg)) + q_tail[h] . tail_c

    g runs over the scale blocks (one dot of K = PK_BLOCK each), q' = q * 2^e_h in fp16 with e_h
    the power of two that puts head h's largest |q| over the quantized channels in [2^14, 2^15):
    q' is exact in fp16 except for channels below 2^-31 of that largest value (far below bf16
    rounding of S), and the codes become fp16 with one conversion per two codes (load_codes_fp16),
    no multiply and no bf16 repack; the scale multiply moves to the [BLOCK_H, BLOCK_T] partial
    scores (BLOCK_H * BLOCK_T per block instead of BLOCK_T * PK_BLOCK). The rope tail (bf16) is one
    bf16 dot. Every product is exact and the sums are fp32, as in the dequantized tile's dot: S
    differs from it by the fp32 summation order only. All loads are issued before any dot (the
    block loop is unrolled). q_rows: the heads' row pointers (bf16*, [BLOCK_H]); row_ptrs: the
    tile's packed rows (uint8*, [BLOCK_T], 16-byte aligned), `live` the columns to read."""
    TAIL: tl.constexpr = (PK_SCALE_OFF - PK_TAIL_OFF) // 2
    tl.static_assert(PK_NQ % PK_BLOCK == 0)
    dims = tl.arange(0, BLOCK_D)
    q_all = tl.load(q_rows[:, None] + dims[None, :], mask=head_ok[:, None] & (dims < PK_NQ)[None, :], other=0.0)
    amax_bits = tl.max(tl.abs(q_all.to(tl.float32)), 1).to(tl.int32, bitcast=True)
    shift = tl.minimum(tl.maximum(14 - (((amax_bits >> 23) & 0xFF) - 127), -100), 100)
    q_unit = _pow2(shift)
    s = tl.zeros([BLOCK_H, BLOCK_T], dtype=tl.float32)
    for g in tl.static_range(PK_NQ // PK_BLOCK):
        kd = g * PK_BLOCK + tl.arange(0, PK_BLOCK)
        q_g = tl.load(q_rows[:, None] + kd[None, :], mask=head_ok[:, None], other=0.0)
        q_g = (q_g.to(tl.float32) * q_unit[:, None]).to(tl.float16)
        k_g = load_codes_fp16(row_ptrs, live, g * PK_BLOCK, PK_BLOCK, PK_FP8_CVT)
        s += tl.dot(q_g, tl.trans(k_g)) * load_block_scale(row_ptrs, live, g, PK_SCALE_OFF)[None, :]
    s = s * (_pow2(-shift) * code_unit(PK_FP8_CVT))[:, None]
    if PK_HAS_TAIL:
        lanes = tl.arange(0, TAIL)
        tail_ok = PK_NQ + lanes < D
        q_tail = tl.load(q_rows[:, None] + PK_NQ + lanes[None, :], mask=head_ok[:, None] & tail_ok[None, :],
                         other=0.0)
        tail_rows = (tl.multiple_of(row_ptrs, 16) + PK_TAIL_OFF).to(tl.pointer_type(tl.bfloat16))
        kv_tail = tl.load(tail_rows[:, None] + lanes[None, :], mask=live[:, None] & tail_ok[None, :], other=0.0)
        s = tl.dot(q_tail, tl.trans(kv_tail), s)
    return s
