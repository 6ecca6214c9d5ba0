"""Triton kernel of a verify step's compressor steps (math: compress_verify_reference.py).

Layouts as compress_decode_triton.py, with G * S token rows (group-major: token g * S + b is
sequence b's g-th) for kv, score, positions, cos, sin, rows_of, rows and target; slots [S] int64;
every state tensor [slots, *row] with contiguous rows, a row being `sub` sub-rows of w floats
(overlap: 2r rows of W = 2d; online: one row of d). The rollback's journal: saved [G, S_max * n,
*row] fp32 (entry b * n + t: tensor t of sequence b) and written [G, S_max] int32.

One program per sequence runs the sequence's G decode steps in order, each exactly
`_compress_decode_kernel`'s (`_pool_overlap_step` / `_pool_online_step`, then `_finish_row`), so
the rows and states are bit-identical to G launches of it. Group g >= 1 first journals what it is
about to overwrite (UNDO): the sub-rows' values after group g - 1 go to saved[g - 1] at their own
offsets, and written[g - 1, b] gets their bit mask:

    overlap: 1 << (r + j)  |  (2^r - 1 when the block completes: the previous block's rows)
    online:  1             (every group rewrites max, sum and acc)

The pre-images come from registers where the step loads them anyway (online: all of it; overlap:
the previous block's first half) and from loads issued beside the step's own (the open row, the
previous block's second half), so the journal adds stores, not a dependent load -> store loop.
Per slot and launch at V4-Flash shapes, k = 3: a CSA compressor (r 4, d 512) journals 3 open rows
of 8 KiB (kv + score) and at most one previous block of 32 KiB (<= 56 KiB of stores) where a copy
of the whole 64 KiB state after every group moved 256 KiB through a serial loop; the indexer's
(d 128) a quarter of that; an HCA compressor (r 128) 3 x 6 KiB from registers. A CTA barrier
separates a group's state writes from the next group's reads (threads of the program touch
different elements in the pooling tiles and the row vectors). One launch replaces G compressor
launches and G state gathers per compressor (30-layer Flash, k = 3: 42 launches instead of 168 +
168).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.compress_decode_triton import _finish_row, _pool_online_step, _pool_overlap_step, launch_layout


@triton.jit
def _compress_verify_kernel(
    kv_ptr, score_ptr, pos_ptr, slot_ptr, bias_ptr, s0_ptr, s1_ptr, s2_ptr,
    w_ptr, cos_ptr, sin_ptr, rows_of_ptr, rows_ptr, target_ptr, pool_ptr, saved_ptr, written_ptr,
    S, groups, d, R, scratch, eps, stride_in, stride_slot, stride_rows_of, stride_cs, stride_pool, stride_saved,
    stride_written,
    RATIO: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    SAVE: tl.constexpr, PDL: tl.constexpr = False,
    HADAMARD: tl.constexpr = False, LOG2_D: tl.constexpr = 0, PACKED: tl.constexpr = False,
    PK_FP4: tl.constexpr = False, PK_NQ: tl.constexpr = 0, PK_BLOCK: tl.constexpr = 1,
    PK_TAIL_OFF: tl.constexpr = 0, PK_SCALE_OFF: tl.constexpr = 0, PK_HAS_TAIL: tl.constexpr = False,
    PK_PAYLOAD: tl.constexpr = 0, PK_ROW_BYTES: tl.constexpr = 0,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    seq = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + seq).to(tl.int64)
    state0, state1, state2 = s0_ptr + slot * stride_slot, s1_ptr + slot * stride_slot, s2_ptr + slot * stride_slot
    n: tl.constexpr = 2 if OVERLAP else 3
    ch = tl.arange(0, BLOCK_D)
    ch_ok = ch < d
    for g in range(groups):
        b = g * S + seq
        p = tl.load(pos_ptr + b)
        j = p % RATIO
        complete = j == RATIO - 1
        journal = g > 0
        undo = saved_ptr + (g - 1) * stride_saved + seq * n * stride_slot  # saved[g - 1], entry seq * n
        if OVERLAP:
            row = _pool_overlap_step(kv_ptr, score_ptr, bias_ptr, state0, state1, b, stride_in, j, complete, d, ch,
                                     ch_ok, RATIO, BLOCK_R, BLOCK_D, undo, undo + stride_slot, journal, SAVE)
            mask = (1 << (RATIO + j)) | tl.where(complete, (1 << RATIO) - 1, 0)
        else:
            row = _pool_online_step(kv_ptr, score_ptr, bias_ptr, state0, state1, state2, b, stride_in, j, complete,
                                    d, ch, ch_ok, undo, undo + stride_slot, undo + 2 * stride_slot, journal, SAVE)
            mask = tl.full((), 1, tl.int32)  # the one sub-row
        if SAVE:
            if journal:
                tl.store(written_ptr + (g - 1) * stride_written + seq, mask.to(tl.int32))
        _finish_row(row, b, p, complete, ch, ch_ok, d, R, eps, w_ptr, cos_ptr, sin_ptr, stride_cs, rows_ptr,
                    rows_of_ptr, stride_rows_of, target_ptr, scratch, pool_ptr, stride_pool, RATIO, BLOCK_D,
                    HADAMARD, LOG2_D, PACKED, PK_FP4, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                    PK_PAYLOAD, PK_ROW_BYTES)
        tl.debug_barrier()  # the group's state writes, visible to every thread of the program


def compress_verify_triton(kv, score, positions, slots, position_bias, state, ratio, norm_weight, eps, cos, sin,
                           rows_of, scratch, out_dtype, groups, saved=None, written=None, pool=None, row_format=None,
                           hadamard=False):
    s, d = slots.shape[0], norm_weight.shape[0]
    rows = torch.empty(groups * s, d, dtype=out_dtype, device=kv.device)
    target = torch.empty(groups * s, dtype=torch.int64, device=kv.device)
    if s == 0:
        return rows, target
    overlap, s0, s1, s2, pk, block_d = launch_layout(state, d, pool, row_format)
    _compress_verify_kernel[(s,)](
        kv, score, positions, slots, position_bias, s0, s1, s2,
        norm_weight, cos, sin, rows_of, rows, target, rows if pool is None else pool,
        s0 if saved is None else saved, target if written is None else written,
        s, groups, d, cos.shape[1], scratch, float(eps), kv.stride(0), s0.stride(0), rows_of.stride(0),
        cos.stride(0), 0 if pool is None else pool.stride(0), 0 if saved is None else saved.stride(0),
        0 if written is None else written.stride(0),
        RATIO=ratio, OVERLAP=overlap, BLOCK_R=triton.next_power_of_2(ratio) if overlap else 1,
        # num_stages 1: the groups loop is sequential (each group reads the state the last one wrote)
        BLOCK_D=block_d, SAVE=saved is not None, num_warps=4, num_stages=1, **pdl_launch(kv),
        **pk,
        **(dict(HADAMARD=True, LOG2_D=d.bit_length() - 1) if hadamard else {}),
    )
    return rows, target
