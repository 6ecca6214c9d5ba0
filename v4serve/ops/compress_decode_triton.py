"""Triton kernel of one compressor decode step (math: compress_decode_reference.py).

Layouts: kv, score [B, W] fp32 (the token's projections; unit stride along W, one row stride
`stride_in` for both, so they may be column slices of one fused projection), positions and slots [B]
int64, position_bias [r, W] fp32; state, overlap: kv and score [slots, 2r, W] fp32 (W = 2d),
online: max, sum, acc [slots, d] fp32; norm_weight [d]; cos, sin [B, R] fp32 (R rope pairs,
the last 2R channels rotate); rows_of [B, n] (compressed-pool row of each block, -1 = none).
Out: rows [B, d] in the pool's dtype, target [B] int64.

One program per sequence holds the whole step: it records the token in the state (overlap: as
row r + j; online: folded into the running softmax), and, when the token completes its block,
pools the block (overlap: the [r, d] tiles of the previous block's first half and this block's
second half, this block's row j taken from registers, not re-read; then this block is copied
over the previous one), RMS-normalises the row (rounded to the pool dtype, as the reference),
rotates the pairs (y[2i], y[2i+1]) of its last 2R channels, and writes the row and its target.
A step that completes no block writes a zero row aimed at the pool's scratch row.

Hadamard (HADAMARD, the indexer's keys): the finished row, rounded to the pool dtype, is then
Walsh-Hadamard transformed in registers (hadamard_triton.hadamard_fp32, the reference's fp32
butterflies; d a power of two) and rounded again before it is written (and packed).

Packed output (PACKED): the program also quantizes and packs its row into pool[target] (uint8
rows of a packed format, kv_pack_triton.pack_row): the cache write, fused.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.hadamard_triton import hadamard_fp32
from v4serve.ops.kv_pack_triton import pack_row, packed_constexprs

DECODE_WARPS = 4  # the decode launch's warps (the verify kernels reproduce its thread layouts)


@triton.jit
def _pool_overlap_step(kv_ptr, score_ptr, bias_ptr, state_kv, state_score, b, stride_in, j, complete, d, ch, ch_ok,
                       RATIO: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, undo_kv=None, undo_score=None,
                       undo_on=False, UNDO: tl.constexpr = False):
    """UNDO (the verify kernel's journal): where `undo_on`, the rows this step overwrites are first
    copied, at their own row offsets, to undo_kv / undo_score (row r + j; rows [0, r) when the
    block completes). Each such load precedes the store to its address in the same tile shape (the
    same thread), as the tile loads of the state below already do."""
    W = 2 * d
    kv_lo = tl.load(kv_ptr + b * stride_in + ch, mask=ch_ok, other=0.0)
    kv_hi = tl.load(kv_ptr + b * stride_in + d + ch, mask=ch_ok, other=0.0)
    sc_lo = tl.load(score_ptr + b * stride_in + ch, mask=ch_ok, other=0.0) + tl.load(bias_ptr + j * W + ch, mask=ch_ok)
    sc_hi = tl.load(score_ptr + b * stride_in + d + ch, mask=ch_ok, other=0.0) + tl.load(bias_ptr + j * W + d + ch,
                                                                                          mask=ch_ok)
    new_row = (RATIO + j) * W
    if UNDO:
        keep = ch_ok & undo_on
        for half in tl.static_range(2):
            at = new_row + half * d + ch
            tl.store(undo_kv + at, tl.load(state_kv + at, mask=keep), mask=keep)
            tl.store(undo_score + at, tl.load(state_score + at, mask=keep), mask=keep)
    tl.store(state_kv + new_row + ch, kv_lo, mask=ch_ok)
    tl.store(state_kv + new_row + d + ch, kv_hi, mask=ch_ok)
    tl.store(state_score + new_row + ch, sc_lo, mask=ch_ok)
    tl.store(state_score + new_row + d + ch, sc_hi, mask=ch_ok)
    row = tl.zeros([BLOCK_D], dtype=tl.float32)
    if complete:
        rr = tl.arange(0, BLOCK_R)
        tile_ok = (rr < RATIO)[:, None] & ch_ok[None, :]
        prev = rr[:, None] * W + ch[None, :]
        this = (RATIO + rr)[:, None] * W + ch[None, :]
        is_new = (rr == j)[:, None]
        prev_kv = tl.load(state_kv + prev, mask=tile_ok, other=0.0)
        prev_sc = tl.load(state_score + prev, mask=tile_ok, other=float("-inf"))
        if UNDO:  # the previous block's rows, both halves, before this block replaces them
            keep_tile = tile_ok & undo_on
            tl.store(undo_kv + prev, prev_kv, mask=keep_tile)
            tl.store(undo_score + prev, prev_sc, mask=keep_tile)
            tl.store(undo_kv + prev + d, tl.load(state_kv + prev + d, mask=keep_tile), mask=keep_tile)
            tl.store(undo_score + prev + d, tl.load(state_score + prev + d, mask=keep_tile), mask=keep_tile)
        kv_a = tl.where(is_new, kv_lo[None, :], tl.load(state_kv + this, mask=tile_ok, other=0.0))
        kv_b = tl.where(is_new, kv_hi[None, :], tl.load(state_kv + this + d, mask=tile_ok, other=0.0))
        sc_a = tl.where(is_new, sc_lo[None, :], tl.load(state_score + this, mask=tile_ok, other=float("-inf")))
        sc_b = tl.where(is_new, sc_hi[None, :], tl.load(state_score + this + d, mask=tile_ok, other=float("-inf")))
        # 2r candidates per channel: the previous block's first half, this block's second half
        m = tl.maximum(tl.max(prev_sc, 0), tl.max(sc_b, 0))
        e_prev = tl.exp(prev_sc - m[None, :])
        e_this = tl.exp(sc_b - m[None, :])
        row = (tl.sum(e_prev * prev_kv, 0) + tl.sum(e_this * kv_b, 0)) / (tl.sum(e_prev, 0) + tl.sum(e_this, 0))
        # this block becomes the previous one
        tl.store(state_kv + prev, kv_a, mask=tile_ok)
        tl.store(state_kv + prev + d, kv_b, mask=tile_ok)
        tl.store(state_score + prev, sc_a, mask=tile_ok)
        tl.store(state_score + prev + d, sc_b, mask=tile_ok)
    return row


@triton.jit
def _pool_online_step(kv_ptr, score_ptr, bias_ptr, state_max, state_sum, state_acc, b, stride_in, j, complete, d, ch,
                      ch_ok, undo_max=None, undo_sum=None, undo_acc=None, undo_on=False, UNDO: tl.constexpr = False):
    """UNDO: where `undo_on`, the state this step replaces (all of it) is also stored, from the
    registers it was loaded into, to undo_max / undo_sum / undo_acc."""
    kv = tl.load(kv_ptr + b * stride_in + ch, mask=ch_ok, other=0.0)
    sc = tl.load(score_ptr + b * stride_in + ch, mask=ch_ok, other=0.0) + tl.load(bias_ptr + j * d + ch, mask=ch_ok)
    m_old = tl.load(state_max + ch, mask=ch_ok, other=0.0)
    m = tl.maximum(m_old, sc)
    rescale = tl.exp(m_old - m)
    weight = tl.exp(sc - m)
    sum_old = tl.load(state_sum + ch, mask=ch_ok, other=1.0)
    acc_old = tl.load(state_acc + ch, mask=ch_ok, other=0.0)
    if UNDO:
        keep = ch_ok & undo_on
        tl.store(undo_max + ch, m_old, mask=keep)
        tl.store(undo_sum + ch, sum_old, mask=keep)
        tl.store(undo_acc + ch, acc_old, mask=keep)
    total = sum_old * rescale + weight
    acc = acc_old * rescale + weight * kv
    tl.store(state_max + ch, tl.where(complete, float("-inf"), m), mask=ch_ok)  # a complete block starts over
    tl.store(state_sum + ch, tl.where(complete, 0.0, total), mask=ch_ok)
    tl.store(state_acc + ch, tl.where(complete, 0.0, acc), mask=ch_ok)
    return acc / total


@triton.jit
def _finish_row(row, b, p, complete, ch, ch_ok, d, R, eps, w_ptr, cos_ptr, sin_ptr, stride_cs, rows_ptr,
                rows_of_ptr, stride_rows_of, target_ptr, scratch, pool_ptr, stride_pool, RATIO: tl.constexpr,
                BLOCK_D: tl.constexpr, HADAMARD: tl.constexpr, LOG2_D: tl.constexpr, PACKED: tl.constexpr,
                PK_FP4: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr,
                PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr, PK_PAYLOAD: tl.constexpr,
                PK_ROW_BYTES: tl.constexpr):
    """Token row b's pooled row (meaningful where `complete`) -> kv_norm, RoPE at the block start,
    Hadamard, its target pool row; writes rows[b], target[b] and, PACKED, the packed pool row."""
    # kv_norm, rounded to the pool dtype at the reference's rounding points
    y = tl.where(ch_ok, row, 0.0).to(rows_ptr.dtype.element_ty).to(tl.float32)
    scale = tl.math.rsqrt(tl.sum(y * y, 0) / d + eps)
    y = tl.load(w_ptr + ch, mask=ch_ok, other=0.0).to(tl.float32) * (y * scale)
    y = y.to(rows_ptr.dtype.element_ty).to(tl.float32)
    # RoPE on the last R pairs at the block start
    even, odd = tl.split(tl.reshape(y, (BLOCK_D // 2, 2)))
    pair = tl.arange(0, BLOCK_D // 2) - (d // 2 - R)
    in_rope = (pair >= 0) & (pair < R)
    cos = tl.load(cos_ptr + b * stride_cs + pair, mask=in_rope, other=1.0)
    sin = tl.load(sin_ptr + b * stride_cs + pair, mask=in_rope, other=0.0)
    y = tl.reshape(tl.join(even * cos - odd * sin, odd * cos + even * sin), (BLOCK_D,))
    if HADAMARD:  # d == BLOCK_D; a step that completes no block transforms its zero row to zeros
        y = hadamard_fp32(tl.where(complete, y, 0.0).to(rows_ptr.dtype.element_ty).to(tl.float32), BLOCK_D, LOG2_D)
    tl.store(rows_ptr + b * d + ch, tl.where(complete, y, 0.0).to(rows_ptr.dtype.element_ty), mask=ch_ok)

    group = tl.maximum((p + 1) // RATIO - 1, 0)
    target = tl.load(rows_of_ptr + b * stride_rows_of + group).to(tl.int64)
    target = tl.where(complete & (target >= 0), target, scratch)
    tl.store(target_ptr + b, target)
    if PACKED:
        y = tl.where(complete & ch_ok, y, 0.0).to(rows_ptr.dtype.element_ty).to(tl.float32)
        pack_row(pool_ptr + target * stride_pool, y, d, BLOCK_D, PK_FP4, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_PAYLOAD, PK_ROW_BYTES)


@triton.jit
def _compress_decode_kernel(
    kv_ptr, score_ptr, pos_ptr, slot_ptr, bias_ptr, s0_ptr, s1_ptr, s2_ptr,
    w_ptr, cos_ptr, sin_ptr, rows_of_ptr, rows_ptr, target_ptr, pool_ptr,
    d, R, scratch, eps, stride_in, stride_slot, stride_rows_of, stride_cs, stride_pool,
    RATIO: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
    HADAMARD: tl.constexpr = False, LOG2_D: tl.constexpr = 0, PACKED: tl.constexpr = False, PK_FP4: tl.constexpr = False, PK_NQ: tl.constexpr = 0, PK_BLOCK: tl.constexpr = 1,
    PK_TAIL_OFF: tl.constexpr = 0, PK_SCALE_OFF: tl.constexpr = 0, PK_HAS_TAIL: tl.constexpr = False,
    PK_PAYLOAD: tl.constexpr = 0, PK_ROW_BYTES: tl.constexpr = 0,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    b = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + b)
    slot = tl.load(slot_ptr + b).to(tl.int64)
    j = p % RATIO
    complete = j == RATIO - 1
    ch = tl.arange(0, BLOCK_D)
    ch_ok = ch < d
    if OVERLAP:
        row = _pool_overlap_step(kv_ptr, score_ptr, bias_ptr, s0_ptr + slot * stride_slot, s1_ptr + slot * stride_slot,
                                 b, stride_in, j, complete, d, ch, ch_ok, RATIO, BLOCK_R, BLOCK_D)
    else:
        row = _pool_online_step(kv_ptr, score_ptr, bias_ptr, s0_ptr + slot * stride_slot, s1_ptr + slot * stride_slot,
                                s2_ptr + slot * stride_slot, b, stride_in, j, complete, d, ch, ch_ok)

    _finish_row(row, b, p, complete, ch, ch_ok, d, R, eps, w_ptr, cos_ptr, sin_ptr, stride_cs, rows_ptr,
                rows_of_ptr, stride_rows_of, target_ptr, scratch, pool_ptr, stride_pool, RATIO, BLOCK_D, HADAMARD,
                LOG2_D, PACKED, PK_FP4, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_PAYLOAD,
                PK_ROW_BYTES)


def launch_layout(state, d, pool, row_format):
    """What a compressor launch (decode or verify) derives from its state and row format: (overlap,
    the three state pointers s0, s1, s2 (s2 = s0 when unused), the packed-row constexprs, BLOCK_D)."""
    overlap = len(state) == 2
    s0, s1 = state[0], state[1]
    s2 = state[2] if not overlap else s0
    pk = {} if pool is None else dict(PACKED=True, **packed_constexprs(row_format, d))
    block_d = triton.next_power_of_2(d)
    if pk and block_d < row_format.block:
        raise ValueError(f"rows of {d} channels are narrower than a {row_format.name} block")
    return overlap, s0, s1, s2, pk, block_d


def compress_decode_triton(kv, score, positions, slots, position_bias, state, ratio, norm_weight, eps, cos, sin,
                           rows_of, scratch, out_dtype, pool=None, row_format=None, hadamard=False):
    B, d = kv.shape[0], norm_weight.shape[0]
    rows = torch.empty(B, d, dtype=out_dtype, device=kv.device)
    target = torch.empty(B, dtype=torch.int64, device=kv.device)
    if B == 0:
        return rows, target
    overlap, s0, s1, s2, pk, block_d = launch_layout(state, d, pool, row_format)
    _compress_decode_kernel[(B,)](
        kv, score, positions, slots, position_bias, s0, s1, s2,
        norm_weight, cos, sin, rows_of, rows, target, rows if pool is None else pool,
        d, cos.shape[1], scratch, float(eps), kv.stride(0), s0.stride(0), rows_of.stride(0), cos.stride(0),
        0 if pool is None else pool.stride(0),
        RATIO=ratio, OVERLAP=overlap, BLOCK_R=triton.next_power_of_2(ratio) if overlap else 1,
        BLOCK_D=block_d, num_warps=DECODE_WARPS, **pdl_launch(kv), **pk,
        **(dict(HADAMARD=True, LOG2_D=d.bit_length() - 1) if hadamard else {}),
    )
    return rows, target
