"""Two-pass sparse attention for decode: a scores pass, then a values pass (math: sparse_attn_reference.py).

Layouts as in sparse_attn_triton.py: q [T, H, D] bf16, pools [N, D] bf16 sharing one 16-byte
aligned row stride, idx [T, C] int32 (-1 = hole), counts [T] int32, sink [H] fp32, out [T, H, D]
bf16 (or uint8 rows of a packed fp8 format: PACKED, dequantized in registers by
kv_pack_triton.load_packed; the scores pass's BLOCK_K slices and the values pass's BLOCK_DV dims
each lie in one scale block of the V4 rows). Every query token is independent (its causal limit is in idx / counts), so any M works;
the kernels are built for decode steps of several sequences (production from 2 tokens).

Why two passes. Split-K decode (sparse_attn_triton.py) spreads a token's C columns over splits
and hands every split's unnormalised output to a merge kernel: fp32 [H, D] per split, 128 KB per
64-column split at DeepSeek-V4's H 64 and D 512 - twice the bytes of the KV tile it came from -
and gathers each KV row once per 16-head block. Since all heads read the same K = V row (MQA)
and D is large, the probabilities are the small intermediate: [H, BLOCK_T] bf16 is 8 KB per
64-column tile. So the state between the two launches is P, not partial outputs:

1. scores, grid (T, n_tiles, cdiv(H, BLOCK_H)): a program owns KV tile j (BLOCK_T columns) of
   one token for BLOCK_H heads. S = Q K^T is a loop over BLOCK_K-wide slices of the head dim,
   so Triton's pipeliner streams both operands into shared memory with cp.async several slices
   ahead. Over the tile's live columns (idx >= 0 and c < n_window + counts[t]; -inf elsewhere):
       s_c = qk_scale_log2 * q[t, h] . kv_c,     m_j = max(sink2, max_c s_c),
       p[t, h, c] = 2^(s_c - m_j) in bf16,       l_j = sum_c 2^(s_c - m_j) in fp32,
   into p [T, H, n_tiles * BLOCK_T] bf16 and m, l [T, n_tiles, H] fp32 (sink2 = sink * log2 e).
   Tiles at or past the token's bound are skipped: the values pass never reads them.
2. values, grid (T, cdiv(D, BLOCK_DV), cdiv(H, BLOCK_H)): a program owns BLOCK_DV output dims
   and walks the token's tiles up to its last live column, two per step, gathering only its
   dims of each KV row:
       m = max(sink2, max_j m_j),   f_j = 2^(m_j - m),
       o[t, h, dims] = sum_j f_j (p_j @ kv_j[:, dims]) / (sum_j f_j l_j + 2^(sink2 - m)).
   The next step's pool rows and maxima come into registers one step ahead (from L1: the
   program loads the token's whole idx row first), so the gathers never wait on an idx load.
   On sm_90+ it is launched with programmatic dependent launch: its prologue overlaps the
   scores pass, and it waits for that grid before reading p, m and l.

Numerics: the split-K kernel rounds P to bf16 relative to the running max, this one relative to
the tile's max (both in (0, 1]); the accumulation is fp32 in both. A token whose columns are all
holes gets exactly 0, as in the split-K kernel.

Over packed rows (issue 17) the scores pass can take its whole tile at once (WHOLE_TILE: one
round of loads, dequantized together, S as one dot; production on sm_90 / sm_100, where its 128
KB of shared memory fit); the values pass can load the next step's bytes into registers one step
ahead (PREFETCH, _packed_values_prefetched), a variant the tile sweep times
(bench/kernel_configs.py). UNPACKED_ROWS (a sweep variant, with WHOLE_TILE): the scores pass also
stores the tile it dequantized as bf16 rows,
    rows[t, c] = unpack(row of column c of token t)     bf16 [T, n_tiles * BLOCK_T, D], holes 0,
for the live tiles only, and the values pass reads rows[t, c] in place of the pool row (the bf16
loop: 16-byte cp.async of contiguous rows, no dequantization; the columns' live mask still from
idx, so tiles the scores pass skipped are never read). The same values into the same dots as
over the unpacked pools, so the bits of the bf16 kernels at these tiles; the cost moves to the
scores pass (64 KB of stores a tile, and Triton 3.6 dequantizes the tile twice, once per layout).

KV_OPERAND (sweep variants, session 14): on sm_90 the values pass's dequantized tile is wgmma's B
operand, which wgmma reads from shared memory only, so every tile is stored there and fenced for the
async proxy (fence.proxy.async: MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S, then a barrier) before its
wgmma: ten times a program at r4 B8, each on the step's dependent chain (the bf16 loop's tiles arrive
by cp.async and need neither). KV_BOUNDARY with VALUE_BLOCK_H 32 makes the dot an mma.sync (M 32), whose
operands come through ldmatrix (a plain barrier, no fence; the boundary keeps the bf16 kWidth 2); KV_LHS
computes out^T [dims, heads] = kv^T p^T with the tile as wgmma's A operand, which it reads from
registers (ldmatrix.trans from a plain shared-memory copy; BLOCK_DV 64: wgmma's M). Both sum the same
products in the same k16 steps of columns.

Measured on the H200 (docs/performance.md item 16): decode B8 r4 / r128 / r0 9.75 / 8.22 / 6.71
µs against split-K's 15.2 / 11.4 / 7.3; split-K stays for single-token steps.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda
from v4serve.ops.kv_pack_triton import dequantize_packed, load_packed, load_packed_bytes
from v4serve.ops.sparse_attn_tiles import bf16_operand_boundary, column_bound, load_rows, row_pointers
from v4serve.ops.sparse_attn_scores_gluon import scores_gluon_applies, two_pass_scores_gluon
from v4serve.ops.sparse_attn_values_gluon import two_pass_values_gluon, values_gluon_applies

_PK_PARAMS = ("PK_NQ", "PK_BLOCK", "PK_TAIL_OFF", "PK_SCALE_OFF", "PK_HAS_TAIL", "PK_FP8_CVT")


@triton.jit
def _sliced_scores(q_rows, head_ok, row_ptrs, live, D, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr,
                   BLOCK_K: tl.constexpr, PACKED: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr,
                   PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr,
                   PK_FP8_CVT: tl.constexpr, TAIL_APART: tl.constexpr):
    """S = Q K^T (fp32 [BLOCK_H, BLOCK_T], unscaled) as a K loop over BLOCK_K-wide slices of the
    head dim: the pipeliner streams both operands into shared memory with cp.async, several slices
    ahead. Over packed rows whose bf16 tail is one whole slice (V4: 448 codes + 64 rope channels at
    BLOCK_K 64) and TAIL_APART, the loop covers the codes only and the tail slice is gathered before
    it (its loads fly during the loop) and dotted after it: the same slices in the same order,
    without a masked tail load and a select in every code slice."""
    TAIL: tl.constexpr = (PK_SCALE_OFF - PK_TAIL_OFF) // 2
    SPLIT_TAIL: tl.constexpr = TAIL_APART and PACKED and PK_HAS_TAIL and PK_NQ % BLOCK_K == 0 and TAIL == BLOCK_K
    s = tl.zeros([BLOCK_H, BLOCK_T], dtype=tl.float32)
    if SPLIT_TAIL:
        tail_dims = PK_NQ + tl.arange(0, BLOCK_K)
        tail_ok = tail_dims < D
        q_tail = tl.load(q_rows[:, None] + tail_dims[None, :], mask=head_ok[:, None] & tail_ok[None, :], other=0.0)
        tail_rows = (tl.multiple_of(row_ptrs, 16) + PK_TAIL_OFF).to(tl.pointer_type(tl.bfloat16))
        kv_tail = tl.load(tail_rows[:, None] + tl.arange(0, BLOCK_K)[None, :], mask=live[:, None] & tail_ok[None, :],
                          other=0.0)
        k_end = PK_NQ
    else:
        k_end = D
    for k in range(0, k_end, BLOCK_K):
        dims = k + tl.arange(0, BLOCK_K)
        q = tl.load(q_rows[:, None] + dims[None, :], mask=head_ok[:, None] & (dims < D)[None, :], other=0.0)
        if PACKED:
            kv = load_packed(row_ptrs, live, k, D, BLOCK_K, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF,
                             PK_HAS_TAIL and not SPLIT_TAIL, tl.bfloat16, PK_FP8_CVT)
        else:
            kv = tl.load(row_ptrs[:, None] + dims[None, :], mask=live[:, None] & (dims < D)[None, :], other=0.0)
        s = tl.dot(q, tl.trans(kv), s)
    if SPLIT_TAIL:
        s = tl.dot(q_tail, tl.trans(kv_tail), s)
    return s


@triton.jit
def _scores_kernel(
    q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, p_ptr, m_ptr, l_ptr, rows_ptr,
    H, D, C, n_window, qk_scale_log2,
    stride_qt, stride_qh, stride_pool, stride_it, stride_pt, stride_ph, stride_mt, stride_mj, stride_rt,
    HAS_COUNTS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False, PACKED: tl.constexpr = False, PK_NQ: tl.constexpr = 0, PK_BLOCK: tl.constexpr = 1,
    PK_TAIL_OFF: tl.constexpr = 0, PK_SCALE_OFF: tl.constexpr = 0, PK_HAS_TAIL: tl.constexpr = False,
    PK_FP8_CVT: tl.constexpr = False, TAIL_APART: tl.constexpr = True, WHOLE_TILE: tl.constexpr = False,
    BLOCK_D: tl.constexpr = 0, STORE_ROWS: tl.constexpr = False,
):
    tok = tl.program_id(0).to(tl.int64)
    tile = tl.program_id(1)
    if PDL:
        gdc_launch_dependents()  # the values pass may start its prologue (it waits for this grid)
    heads = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    hi = column_bound(counts_ptr, tok, C, n_window, HAS_COUNTS)
    if tile * BLOCK_T < hi:
        cols = tile * BLOCK_T + tl.arange(0, BLOCK_T)
        rows = load_rows(idx_ptr, tok, stride_it, cols, hi)
        live = rows >= 0
        row_ptrs = row_pointers(win_ptr, cmp_ptr, rows, cols, n_window, stride_pool)
        q_rows = q_ptr + tok * stride_qt + heads * stride_qh
        if WHOLE_TILE:
            # The whole [BLOCK_T, BLOCK_D] tile gathered in one round of loads, S as one dot.
            dims = tl.arange(0, BLOCK_D)
            q = tl.load(q_rows[:, None] + dims[None, :], mask=head_ok[:, None] & (dims < D)[None, :], other=0.0)
            if PACKED:
                kv = load_packed(row_ptrs, live, 0, D, BLOCK_D, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF,
                                 PK_HAS_TAIL, tl.bfloat16, PK_FP8_CVT)
                if STORE_ROWS:
                    # The dequantized tile as bf16 rows (token tok, columns `cols`; holes zero) for the
                    # values pass, stored before the dot so the stores drain while it runs. Triton
                    # 3.6 computes the dequantization twice for this, once in the store's register
                    # layout and once in the dot operand's (an opaque inline-asm identity before both
                    # uses is cloned too). Stored per scale block ([BLOCK_T, NG, PK_BLOCK], the shape
                    # of the code loads) it costs least: sm_90 SASS 1681 instructions, 162 registers
                    # (as a [BLOCK_T, BLOCK_D] store 1898 and 229; without the store 1116 and 72).
                    NG: tl.constexpr = BLOCK_D // PK_BLOCK
                    tl.static_assert(NG * PK_BLOCK == BLOCK_D)
                    ch = tl.arange(0, NG)[:, None] * PK_BLOCK + tl.arange(0, PK_BLOCK)[None, :]
                    tl.store(rows_ptr + tok * stride_rt + cols[:, None, None] * D + ch[None, :, :],
                             tl.reshape(kv, (BLOCK_T, NG, PK_BLOCK)), mask=(ch < D)[None, :, :])
            else:
                kv = tl.load(row_ptrs[:, None] + dims[None, :], mask=live[:, None] & (dims < D)[None, :], other=0.0)
            s = tl.dot(q, tl.trans(kv))
        else:
            s = _sliced_scores(q_rows, head_ok, row_ptrs, live, D, BLOCK_H, BLOCK_T, BLOCK_K, PACKED, PK_NQ, PK_BLOCK,
                               PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_FP8_CVT, TAIL_APART)
        sink2 = tl.load(sink_ptr + heads, mask=head_ok, other=0.0) * 1.4426950408889634
        s = tl.where(live[None, :], s * qk_scale_log2, float("-inf"))
        m_j = tl.maximum(sink2, tl.max(s, 1))
        p = tl.exp2(s - m_j[:, None])
        tl.store(p_ptr + tok * stride_pt + heads[:, None] * stride_ph + cols[None, :],
                 p.to(p_ptr.dtype.element_ty), mask=head_ok[:, None])
        ml = tok * stride_mt + tile * stride_mj + heads
        tl.store(m_ptr + ml, m_j, mask=head_ok)
        tl.store(l_ptr + ml, tl.sum(p, 1), mask=head_ok)


# What a values program's dims read (the V_* constexprs of _tile_values): bf16 pool rows; packed rows,
# dims in the codes and the rope tail alike (one select per element: the program's dims are known
# at run time only); packed rows, dims in the codes only; packed rows, dims in the bf16 tail only;
# the token's bf16 rows in column order that the scores pass wrote (UNPACKED_ROWS: row = column).
V_BF16 = tl.constexpr(0)
V_PACKED = tl.constexpr(1)
V_CODES = tl.constexpr(2)
V_TAIL = tl.constexpr(3)
V_TOKEN_ROWS = tl.constexpr(4)
# How a values program feeds its tile to the dot (KV_OPERAND, bit flags; 0 in production): KV_BOUNDARY
# passes a dequantized tile through sparse_attn_tiles.bf16_operand_boundary first (an mma.sync operand
# then takes the bf16 layout, kWidth 2); KV_LHS computes the transpose, out^T [dims, heads] =
# kv^T @ p^T, so that the tile is the dot's left operand, which wgmma reads from registers (as the
# right operand it must be stored to shared memory and fenced for the async proxy before every
# wgmma: MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S + BAR.SYNC per tile on sm_90).
KV_BOUNDARY = tl.constexpr(1)
KV_LHS = tl.constexpr(2)


@triton.jit
def _tile_values(win_ptr, cmp_ptr, p_ptr, tok, j, rows, m_j, m, n_live, n_window, stride_pool, stride_pt, stride_ph,
                 heads, head_ok, dims, dim_ok, BLOCK_T: tl.constexpr, d0, D, BLOCK_DV: tl.constexpr,
                 READS: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr,
                 PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr, PK_FP8_CVT: tl.constexpr,
                 KV_OPERAND: tl.constexpr = 0):
    """f_j (p_j @ kv_j[:, dims]) of tile j, whose pool rows and max are `rows` and `m_j`; 0 when
    j >= n_live (p masked: the scores pass did not write that tile). READS: what the dims read (V_*);
    V_TOKEN_ROWS reads row `col` of the token's rows at win_ptr, masked by `rows` like a pool gather
    (the scores pass wrote only the live tiles). KV_OPERAND (KV_BOUNDARY / KV_LHS flags): how the tile
    enters the dot; with KV_LHS the result is the transpose, [dims, heads]."""
    cols = j * BLOCK_T + tl.arange(0, BLOCK_T)
    if READS == V_TOKEN_ROWS:
        row_ptrs = win_ptr + cols * stride_pool  # win_ptr: the token's first row
    else:
        row_ptrs = row_pointers(win_ptr, cmp_ptr, rows, cols, n_window, stride_pool)
    if READS == V_PACKED or READS == V_CODES:
        kv = load_packed(row_ptrs, rows >= 0, d0, D, BLOCK_DV, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF,
                         PK_HAS_TAIL and READS == V_PACKED, tl.bfloat16, PK_FP8_CVT)
    elif READS == V_TAIL:
        tail_rows = (tl.multiple_of(row_ptrs, 16) + PK_TAIL_OFF).to(tl.pointer_type(tl.bfloat16))
        kv = tl.load(tail_rows[:, None] + (dims - PK_NQ)[None, :], mask=(rows >= 0)[:, None] & dim_ok[None, :],
                     other=0.0)
    else:
        kv = tl.load(row_ptrs[:, None] + dims[None, :], mask=(rows >= 0)[:, None] & dim_ok[None, :], other=0.0)
    p = tl.load(p_ptr + tok * stride_pt + heads[:, None] * stride_ph + cols[None, :],
                mask=head_ok[:, None] & (j < n_live), other=0.0)
    f = tl.where(j < n_live, tl.exp2(m_j - m), 0.0)
    kv = bf16_operand_boundary(kv, (KV_BOUNDARY & KV_OPERAND) != 0)
    if (KV_LHS & KV_OPERAND) != 0:
        part = tl.dot(tl.trans(kv), tl.trans(p)) * f[None, :]
    else:
        part = tl.dot(p, kv) * f[:, None]
    return part


@triton.jit
def _values_loop(win_ptr, cmp_ptr, idx_ptr, p_ptr, m_row, tok, hi, n_live, m, n_window, stride_pool, stride_it,
                 stride_pt, stride_ph, stride_mj, heads, head_ok, dims, dim_ok, d0, D, BLOCK_H: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_DV: tl.constexpr, READS: tl.constexpr, PK_NQ: tl.constexpr,
                 PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr,
                 PK_HAS_TAIL: tl.constexpr, PK_FP8_CVT: tl.constexpr, KV_OPERAND: tl.constexpr = 0):
    """sum_j f_j p_j kv_j[:, dims] over the token's live tiles ([BLOCK_H, BLOCK_DV]; its transpose
    with KV_OPERAND's KV_LHS), two per step (half the dependent steps; the second is empty past the
    last live tile). Their pool rows and maxima are loaded into
    registers one step ahead, so no step waits on an idx -> gather round trip or on the load of
    its scales."""
    lanes = tl.arange(0, BLOCK_T)
    next_rows_a = load_rows(idx_ptr, tok, stride_it, lanes, hi)
    next_rows_b = load_rows(idx_ptr, tok, stride_it, BLOCK_T + lanes, hi)
    next_m_a = tl.load(m_row, mask=head_ok & (n_live > 0), other=0.0)
    next_m_b = tl.load(m_row + stride_mj, mask=head_ok & (n_live > 1), other=0.0)
    if (KV_LHS & KV_OPERAND) != 0:
        acc = tl.zeros([BLOCK_DV, BLOCK_H], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for j in range(0, n_live, 2):
        rows_a, rows_b, m_a, m_b = next_rows_a, next_rows_b, next_m_a, next_m_b
        next_rows_a = load_rows(idx_ptr, tok, stride_it, (j + 2) * BLOCK_T + lanes, hi)
        next_rows_b = load_rows(idx_ptr, tok, stride_it, (j + 3) * BLOCK_T + lanes, hi)
        next_m_a = tl.load(m_row + (j + 2) * stride_mj, mask=head_ok & (j + 2 < n_live), other=0.0)
        next_m_b = tl.load(m_row + (j + 3) * stride_mj, mask=head_ok & (j + 3 < n_live), other=0.0)
        acc += _tile_values(win_ptr, cmp_ptr, p_ptr, tok, j, rows_a, m_a, m, n_live, n_window, stride_pool,
                            stride_pt, stride_ph, heads, head_ok, dims, dim_ok, BLOCK_T, d0, D, BLOCK_DV,
                            READS, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_FP8_CVT, KV_OPERAND)
        acc += _tile_values(win_ptr, cmp_ptr, p_ptr, tok, j + 1, rows_b, m_b, m, n_live, n_window, stride_pool,
                            stride_pt, stride_ph, heads, head_ok, dims, dim_ok, BLOCK_T, d0, D, BLOCK_DV,
                            READS, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_FP8_CVT, KV_OPERAND)
    return acc


@triton.jit
def _packed_values_prefetched(win_ptr, cmp_ptr, idx_ptr, p_ptr, m_row, tok, hi, n_live, m, rows_a, rows_b, m_a, m_b,
                              n_window, stride_pool, stride_it, stride_pt, stride_ph, stride_mj, heads, head_ok, d0, D,
                              BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DV: tl.constexpr,
                              PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr,
                              PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr, PK_FP8_CVT: tl.constexpr):
    """The values loop over packed rows (PREFETCH) with the bytes of the next two tiles (codes, scale
    words, rope tail: kv_pack_triton.load_packed_bytes) loaded into registers one step ahead, so a
    step dequantizes bytes already there while the next step's gathers fly (the bf16 loop gets this
    from the pipeliner's cp.async stages; a load that feeds arithmetic before the dot does not).
    rows_a / rows_b, m_a / m_b: pool rows and maxima of tiles 0 and 1. Returns sum_j f_j p_j kv_j."""
    lanes = tl.arange(0, BLOCK_T)
    codes_a, sw_a, tail_a = load_packed_bytes(
        row_pointers(win_ptr, cmp_ptr, rows_a, lanes, n_window, stride_pool), rows_a >= 0, d0, D, BLOCK_DV, PK_NQ,
        PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL)
    codes_b, sw_b, tail_b = load_packed_bytes(
        row_pointers(win_ptr, cmp_ptr, rows_b, BLOCK_T + lanes, n_window, stride_pool), rows_b >= 0, d0, D, BLOCK_DV,
        PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for j in range(0, n_live, 2):
        kv_a = dequantize_packed(codes_a, sw_a, tail_a, d0, D, BLOCK_DV, PK_NQ, PK_BLOCK, PK_HAS_TAIL, tl.bfloat16,
                                 PK_FP8_CVT)
        kv_b = dequantize_packed(codes_b, sw_b, tail_b, d0, D, BLOCK_DV, PK_NQ, PK_BLOCK, PK_HAS_TAIL, tl.bfloat16,
                                 PK_FP8_CVT)
        f_a = tl.where(j < n_live, tl.exp2(m_a - m), 0.0)
        f_b = tl.where(j + 1 < n_live, tl.exp2(m_b - m), 0.0)
        # the next step's bytes and maxima (the idx row is in L1: the kernel read it whole)
        cols_a = (j + 2) * BLOCK_T + lanes
        cols_b = (j + 3) * BLOCK_T + lanes
        rows_a = load_rows(idx_ptr, tok, stride_it, cols_a, hi)
        rows_b = load_rows(idx_ptr, tok, stride_it, cols_b, hi)
        codes_a, sw_a, tail_a = load_packed_bytes(
            row_pointers(win_ptr, cmp_ptr, rows_a, cols_a, n_window, stride_pool), rows_a >= 0, d0, D, BLOCK_DV, PK_NQ,
            PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL)
        codes_b, sw_b, tail_b = load_packed_bytes(
            row_pointers(win_ptr, cmp_ptr, rows_b, cols_b, n_window, stride_pool), rows_b >= 0, d0, D, BLOCK_DV, PK_NQ,
            PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL)
        p_rows = p_ptr + tok * stride_pt + heads[:, None] * stride_ph
        p_a = tl.load(p_rows + (j * BLOCK_T + lanes)[None, :], mask=head_ok[:, None] & (j < n_live), other=0.0)
        p_b = tl.load(p_rows + ((j + 1) * BLOCK_T + lanes)[None, :], mask=head_ok[:, None] & (j + 1 < n_live),
                      other=0.0)
        m_a = tl.load(m_row + (j + 2) * stride_mj, mask=head_ok & (j + 2 < n_live), other=0.0)
        m_b = tl.load(m_row + (j + 3) * stride_mj, mask=head_ok & (j + 3 < n_live), other=0.0)
        acc += tl.dot(p_a, kv_a) * f_a[:, None]
        acc += tl.dot(p_b, kv_b) * f_b[:, None]
    return acc


@triton.jit
def _live_tiles(idx_ptr, tok, stride_it, c0, hi, tiles, BLOCK_T: tl.constexpr):
    """Tiles of token `tok` up to its last live column among the len(tiles) tiles from column c0."""
    cols = c0 + tiles[:, None] * BLOCK_T + tl.arange(0, BLOCK_T)[None, :]
    rows = load_rows(idx_ptr, tok, stride_it, cols, hi)
    return tl.cdiv(tl.max(tl.max(tl.where(rows >= 0, cols + 1, 0), 1), 0), BLOCK_T)


@triton.jit
def _tile_stats(m_ptr, l_ptr, tok, j0, n_live, tiles, heads, head_ok, stride_mt, stride_mj):
    """(m_j, l_j) [len(tiles), len(heads)] of tiles j0 + tiles (-inf / 0 from n_live on)."""
    ok = ((j0 + tiles) < n_live)[:, None] & head_ok[None, :]
    ml = tok * stride_mt + (j0 + tiles)[:, None] * stride_mj + heads[None, :]
    return tl.load(m_ptr + ml, mask=ok, other=float("-inf")), tl.load(l_ptr + ml, mask=ok, other=0.0)


@triton.jit
def _values_kernel(
    win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, p_ptr, m_ptr, l_ptr, out_ptr,
    H, D, C, n_window,
    stride_pool, stride_it, stride_pt, stride_ph, stride_mt, stride_mj, stride_ot, stride_oh, stride_rt,
    HAS_COUNTS: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_DV: tl.constexpr,
    BLOCK_J: tl.constexpr, EVEN_D: tl.constexpr, PDL: tl.constexpr = False, PACKED: tl.constexpr = False,
    PK_NQ: tl.constexpr = 0, PK_BLOCK: tl.constexpr = 1, PK_TAIL_OFF: tl.constexpr = 0, PK_SCALE_OFF: tl.constexpr = 0,
    PK_HAS_TAIL: tl.constexpr = False, PK_FP8_CVT: tl.constexpr = False, PREFETCH: tl.constexpr = False,
    TAIL_PROGRAMS: tl.constexpr = False, TOKEN_ROWS: tl.constexpr = False, KV_OPERAND: tl.constexpr = 0,
    ROUNDS: tl.constexpr = False,
):
    tok = tl.program_id(0).to(tl.int64)
    d0 = tl.program_id(1) * BLOCK_DV
    dims = d0 + tl.arange(0, BLOCK_DV)
    heads = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_ok = heads < H
    if EVEN_D:
        dim_ok = tl.full([BLOCK_DV], True, tl.int1)
    else:
        dim_ok = dims < D
    hi = column_bound(counts_ptr, tok, C, n_window, HAS_COUNTS)
    # Tiles up to the last live column (holes past it contribute nothing). Loading the token's
    # idx row for this also brings it into the SM's L1, where the loop's per-step loads of the next
    # tiles' rows find it instead of paying an L2 round trip each step. ROUNDS (more tiles than
    # BLOCK_J: a wide cache) reads BLOCK_J tiles a round below the token's bound instead of one block.
    tiles = tl.arange(0, BLOCK_J)
    if ROUNDS:
        n_live = 0
        for c0 in range(0, hi, BLOCK_J * BLOCK_T):
            n_live = tl.maximum(n_live, _live_tiles(idx_ptr, tok, stride_it, c0, hi, tiles, BLOCK_T))
    else:
        n_live = _live_tiles(idx_ptr, tok, stride_it, 0, hi, tiles, BLOCK_T)
    sink2 = tl.load(sink_ptr + heads, mask=head_ok, other=0.0) * 1.4426950408889634
    if PDL:
        gdc_wait()  # the scores pass's p, m and l are complete and visible past this point
    # The softmax's max and denominator over the live tiles' m_j and l_j (and the sink's term).
    if ROUNDS:
        m = sink2
        for j0 in range(0, n_live, BLOCK_J):
            m_tiles, _ = _tile_stats(m_ptr, l_ptr, tok, j0, n_live, tiles, heads, head_ok, stride_mt, stride_mj)
            m = tl.maximum(m, tl.max(m_tiles, 0))
        denom = tl.exp2(sink2 - m)
        for j0 in range(0, n_live, BLOCK_J):
            m_tiles, l_tiles = _tile_stats(m_ptr, l_ptr, tok, j0, n_live, tiles, heads, head_ok, stride_mt, stride_mj)
            denom += tl.sum(l_tiles * tl.exp2(m_tiles - m[None, :]), 0)
    else:
        m_tiles, l_tiles = _tile_stats(m_ptr, l_ptr, tok, 0, n_live, tiles, heads, head_ok, stride_mt, stride_mj)
        m = tl.maximum(sink2, tl.max(m_tiles, 0))
        denom = tl.sum(l_tiles * tl.exp2(m_tiles - m[None, :]), 0) + tl.exp2(sink2 - m)
    m_row = m_ptr + tok * stride_mt + heads
    if PACKED and PREFETCH:
        lanes = tl.arange(0, BLOCK_T)
        acc = _packed_values_prefetched(
            win_ptr, cmp_ptr, idx_ptr, p_ptr, m_row, tok, hi, n_live, m, load_rows(idx_ptr, tok, stride_it, lanes, hi),
            load_rows(idx_ptr, tok, stride_it, BLOCK_T + lanes, hi), tl.load(m_row, mask=head_ok & (n_live > 0), other=0.0),
            tl.load(m_row + stride_mj, mask=head_ok & (n_live > 1), other=0.0), n_window, stride_pool, stride_it,
            stride_pt, stride_ph, stride_mj, heads, head_ok, d0, D, BLOCK_H, BLOCK_T, BLOCK_DV, PK_NQ, PK_BLOCK,
            PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_FP8_CVT)
    elif PACKED and PK_HAS_TAIL and TAIL_PROGRAMS:
        # BLOCK_DV divides PK_NQ (asserted by the launcher): a program's dims are all codes or all tail.
        if d0 >= PK_NQ:
            acc = _values_loop(win_ptr, cmp_ptr, idx_ptr, p_ptr, m_row, tok, hi, n_live, m, n_window, stride_pool,
                               stride_it, stride_pt, stride_ph, stride_mj, heads, head_ok, dims, dim_ok, d0, D,
                               BLOCK_H, BLOCK_T, BLOCK_DV, V_TAIL, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF,
                               PK_HAS_TAIL, PK_FP8_CVT)
        else:
            acc = _values_loop(win_ptr, cmp_ptr, idx_ptr, p_ptr, m_row, tok, hi, n_live, m, n_window, stride_pool,
                               stride_it, stride_pt, stride_ph, stride_mj, heads, head_ok, dims, dim_ok, d0, D,
                               BLOCK_H, BLOCK_T, BLOCK_DV, V_CODES, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF,
                               PK_HAS_TAIL, PK_FP8_CVT)
    elif TOKEN_ROWS:
        # win_ptr: bf16 rows in column order, stride_rt apart per token (the scores pass's STORE_ROWS)
        token_rows = win_ptr + tok * stride_rt
        acc = _values_loop(token_rows, token_rows, idx_ptr, p_ptr, m_row, tok, hi, n_live, m, n_window, stride_pool,
                           stride_it, stride_pt, stride_ph, stride_mj, heads, head_ok, dims, dim_ok, d0, D, BLOCK_H,
                           BLOCK_T, BLOCK_DV, V_TOKEN_ROWS, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                           PK_FP8_CVT)
    else:
        acc = _values_loop(win_ptr, cmp_ptr, idx_ptr, p_ptr, m_row, tok, hi, n_live, m, n_window, stride_pool,
                           stride_it, stride_pt, stride_ph, stride_mj, heads, head_ok, dims, dim_ok, d0, D, BLOCK_H,
                           BLOCK_T, BLOCK_DV, V_PACKED if PACKED else V_BF16, PK_NQ, PK_BLOCK, PK_TAIL_OFF,
                           PK_SCALE_OFF, PK_HAS_TAIL, PK_FP8_CVT, KV_OPERAND)
    if (KV_LHS & KV_OPERAND) != 0:  # acc is [BLOCK_DV, BLOCK_H]
        out = acc / denom[None, :]
        tl.store(out_ptr + tok * stride_ot + heads[None, :] * stride_oh + dims[:, None],
                 out.to(out_ptr.dtype.element_ty), mask=head_ok[None, :] & dim_ok[:, None])
    else:
        out = acc / denom[:, None]
        tl.store(out_ptr + tok * stride_ot + heads[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=head_ok[:, None] & dim_ok[None, :])


# The values pass reads the tiles' rows, maxima and sums in one block of up to VALUES_MAX_TILES tiles
# (2048 columns at 64 a tile: every C of a V4 / V4-Pro decode step up to max_model_len 240K, the
# kernel's code since session 10); beyond, in rounds of that many below the token's bound (ROUNDS), so
# a 1M-token cache costs what its live columns cost, not a [C / 64, heads] block of registers. A tile
# config may set its own.
VALUES_MAX_TILES = 32


def _launch_pk(pk) -> dict:
    """PACKED and the PK_* constexprs the two kernels take, from packed_constexprs' dict (or None)."""
    return {k: v for k, v in (pk or {}).items() if k == "PACKED" or k in _PK_PARAMS}


def two_pass_tail_apart(device: torch.device) -> bool:
    """The default of TAIL_APART: on with wgmma (sm_90 / sm_100) and in the interpreter; off where the
    scores pass runs mma.sync (sm_80 / sm_89 / sm_120), whose registers the tail slice held across the
    loop overflows (8 bytes of stack on sm_120 under Triton 3.6, codegen check)."""
    return not compiled_on_cuda(device) or torch.cuda.get_device_capability(device)[0] in (9, 10)


def sparse_attn_two_pass(qt, win, cmp, it, ct, sink, out, n_window, qk_scale_log2, has_counts, pdl, cfg, pk=None):
    """Launch both passes on [T, H, D] views as sparse_attn_triton.py prepares them.

    cfg: BLOCK_H, BLOCK_T, BLOCK_K (the scores pass's head-dim slice), BLOCK_DV, VALUE_BLOCK_H (the
    values pass's heads per program; default BLOCK_H), TAIL_APART (packed rows: the rope tail slice
    gathered before the code slices; default two_pass_tail_apart(device)), WHOLE_TILE (the scores
    pass gathers its whole tile at once and computes S as one dot instead of the K loop; default
    False), UNPACKED_ROWS (packed rows, WHOLE_TILE: the scores pass also writes its dequantized
    tile as bf16 rows, [T, n_tiles * BLOCK_T, D] in column order, and the values pass reads those
    instead of dequantizing the packed rows again; default False), PREFETCH (packed rows: the
    values pass loads the next step's bytes into registers one step ahead; default False),
    TAIL_PROGRAMS (packed rows with a bf16 tail, BLOCK_DV dividing the quantized channels: each
    values program reads either codes or the tail, a branch per program instead of a select per
    value; default False), KV_OPERAND (packed rows, the plain values loop: how a values program feeds
    its dequantized tile to the dot, KV_BOUNDARY / KV_LHS flags; default 0), VALUES_KERNEL ("gluon":
    the values pass over packed rows by sparse_attn_values_gluon.py where it applies, sm_90, over
    VALUE_WARPGROUPS 1 or 2 warpgroups a program; default the `tl` kernel), SCORES_KERNEL ("gluon": the
    scores pass over packed rows by sparse_attn_scores_gluon.py where it applies, sm_90), and the launch options
    of each pass as SCORES / VALUES =
    dict(num_warps=..., num_stages=...). pk: PACKED and the PK_* constexprs
    (kv_pack_triton.packed_constexprs) for packed pools, None / {} for bf16 pools."""
    p, m, l, rows = two_pass_scores(qt, win, cmp, it, ct, sink, n_window, qk_scale_log2, has_counts, pdl, cfg, pk)
    return two_pass_values(win, cmp, it, ct, sink, p, m, l, out, n_window, has_counts, pdl, cfg, pk, rows)


def two_pass_scores(qt, win, cmp, it, ct, sink, n_window, qk_scale_log2, has_counts, pdl, cfg, pk):
    """The scores pass alone (sparse_attn_two_pass's arguments): p [T, H, n_tiles * BLOCK_T] bf16,
    m and l [T, n_tiles, H] fp32, and rows: the dequantized tiles [T, n_tiles * BLOCK_T, D] bf16
    (cfg UNPACKED_ROWS over packed rows; only the live tiles written) or None. cfg["SCORES_KERNEL"] ==
    "gluon": the Gluon kernel over packed pools where it applies (`scores_gluon_applies`)."""
    packed, pk = pk, _launch_pk(pk)
    T, H, D = qt.shape
    C = it.shape[1]
    block_t, block_h = cfg["BLOCK_T"], cfg["BLOCK_H"]
    block_d = max(16, triton.next_power_of_2(D))
    n_tiles = max(1, triton.cdiv(C, block_t))
    whole_tile = cfg.get("WHOLE_TILE", False)
    store_rows = bool(pk) and cfg.get("UNPACKED_ROWS", False)
    if store_rows and not whole_tile:
        raise ValueError("UNPACKED_ROWS needs WHOLE_TILE: the scores pass writes the whole tile it dequantized")
    p = torch.empty(T, H, n_tiles * block_t, dtype=torch.bfloat16, device=qt.device)
    m = torch.empty(T, n_tiles, H, dtype=torch.float32, device=qt.device)
    l = torch.empty_like(m)
    if (cfg.get("SCORES_KERNEL") == "gluon" and not store_rows
            and scores_gluon_applies(qt, packed, block_t, (win, cmp))):
        two_pass_scores_gluon(qt, win, cmp, it, ct, sink, p, m, l, n_window, qk_scale_log2, has_counts, pdl, packed)
        return p, m, l, None
    rows = torch.empty(T, n_tiles * block_t, D, dtype=torch.bfloat16, device=qt.device) if store_rows else None
    _scores_kernel[(T, n_tiles, triton.cdiv(H, block_h))](
        qt, win, cmp, it, ct, sink, p, m, l, p if rows is None else rows,
        H, D, C, n_window, qk_scale_log2,
        qt.stride(0), qt.stride(1), win.stride(0), it.stride(0), p.stride(0), p.stride(1), m.stride(0), m.stride(1),
        0 if rows is None else rows.stride(0),
        HAS_COUNTS=has_counts, BLOCK_H=block_h, BLOCK_T=block_t, BLOCK_K=min(cfg["BLOCK_K"], block_d), PDL=pdl,
        TAIL_APART=cfg.get("TAIL_APART", two_pass_tail_apart(qt.device)), WHOLE_TILE=whole_tile,
        BLOCK_D=block_d, STORE_ROWS=store_rows,
        **cfg["SCORES"], **pk,
    )
    return p, m, l, rows


def two_pass_values(win, cmp, it, ct, sink, p, m, l, out, n_window, has_counts, pdl, cfg, pk, rows=None):
    """The values pass alone over the scores pass's p, m, l: writes and returns out [T, H, D]. rows
    (the scores pass's dequantized tiles, or None): read instead of the pools, as bf16 rows.
    cfg["VALUES_KERNEL"] == "gluon": the Gluon kernel over packed pools where it applies
    (`values_gluon_applies`), else this module's."""
    n_tiles = m.shape[1]
    if (cfg.get("VALUES_KERNEL") == "gluon" and rows is None
            and values_gluon_applies(out, pk, cfg["BLOCK_T"], n_tiles, (win, cmp))):
        return two_pass_values_gluon(win, cmp, it, ct, sink, p, m, l, out, n_window, has_counts, pdl, pk,
                                     cfg.get("VALUE_WARPGROUPS", 1))
    pk = {} if rows is not None else _launch_pk(pk)
    T, H, D = out.shape
    C = it.shape[1]
    block_t, block_hv = cfg["BLOCK_T"], cfg.get("VALUE_BLOCK_H", cfg["BLOCK_H"])
    block_dv = min(cfg["BLOCK_DV"], max(16, triton.next_power_of_2(D)))
    block_j = min(triton.next_power_of_2(n_tiles), cfg.get("VALUES_MAX_TILES", VALUES_MAX_TILES))
    if rows is not None:
        win = cmp = rows
    kv_operand = cfg.get("KV_OPERAND", 0) if pk else 0
    if kv_operand and (cfg.get("PREFETCH", False) or cfg.get("TAIL_PROGRAMS", False)):
        raise ValueError("KV_OPERAND is a variant of the plain values loop (no PREFETCH, no TAIL_PROGRAMS)")
    if kv_operand & 1 and not compiled_on_cuda(out.device):
        kv_operand &= ~1  # no inline asm in the interpreter (the boundary changes no value)
    _values_kernel[(T, triton.cdiv(D, block_dv), triton.cdiv(H, block_hv))](
        win, cmp, it, ct, sink, p, m, l, out,
        H, D, C, n_window,
        win.stride(-2), it.stride(0), p.stride(0), p.stride(1), m.stride(0), m.stride(1), out.stride(0),
        out.stride(1), 0 if rows is None else rows.stride(0),
        HAS_COUNTS=has_counts, BLOCK_H=block_hv, BLOCK_T=block_t, BLOCK_DV=block_dv,
        BLOCK_J=block_j, ROUNDS=block_j < n_tiles, EVEN_D=D % block_dv == 0,
        PREFETCH=bool(pk) and cfg.get("PREFETCH", False),
        # Tail programs (each values program reads codes or the bf16 tail, not both) measured slower
        # on the H200 in session 12 (r4 / r128 B8 14.61 / 11.75 µs against session 11's 13.19 / 10.85
        # without them; the same run also changed the scale multiply): off until the sweep's
        # "tail_programs" row (kernel_configs "fp8kv r4") settles which change cost it.
        TAIL_PROGRAMS=bool(pk) and cfg.get("TAIL_PROGRAMS", False) and pk["PK_NQ"] % block_dv == 0,
        TOKEN_ROWS=rows is not None, KV_OPERAND=kv_operand,
        **cfg["VALUES"], **pk,
        **(dict(PDL=True, launch_pdl=True) if pdl else {}),
    )
    return out
