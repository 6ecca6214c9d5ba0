"""Triton kernels of a verify step's compressor steps (math: compress_verify_reference.py).

Layouts as compress_decode_triton.py, with G * S token rows (group-major: token g * S + b is
sequence b's g-th) for kv, score, positions, cos, sin, rows_of, rows and target; slots [S] int64;
every state tensor [slots, *row] with contiguous rows, a row being `sub` sub-rows of w floats
(overlap: 2r rows of W = 2d; online: one row of d). The rollback's journal: saved [G, S_max * n,
*row] fp32 (entry b * n + t: tensor t of sequence b) and written [G, S_max] int32. Between the two
launches: pooled [G * S, d] fp32, token order (a row that completes no block holds zeros or its
open block's partial pool; the finish masks it).

Two launches, split where the dependencies split:

1. `_compress_verify_pool_kernel`, grid (S, C = cdiv(d, BLOCK_C)), BLOCK_C = min(128, BLOCK_D):
   program (b, c) owns channels ch in [c * BLOCK_C, (c + 1) * BLOCK_C) of sequence b, i.e. the
   state elements x * w + ch and (overlap) x * w + d + ch of every sub-row x, and runs the G groups
   in order, each exactly `_compress_decode_kernel`'s pooling step (`_pool_overlap_step` /
   `_pool_online_step`) on its slice: the softmax over the 2r candidates and the state update run
   down a channel, so slices never exchange data. Group g >= 1 first journals what it is about to
   overwrite, in its slice (UNDO): the sub-rows' values after group g - 1 go to saved[g - 1] at
   their own offsets, and written[g - 1, b] gets their bit mask (the same for every slice; slice 0
   stores it):

       overlap: 1 << (r + j)  |  (2^r - 1 when the block completes: the previous block's rows)
       online:  1             (every group rewrites max, sum and acc)

   Each pre-image is loaded by the thread that then overwrites it (beside the step's own loads, or
   from its registers), so the journal adds stores, not a dependent load -> store loop; a CTA
   barrier separates a group's state writes from the next group's reads, and the next group's
   position is loaded during the group. The pooled row goes to pooled[g * S + b, slice].
2. `_compress_verify_finish_kernel`, grid (G * S,): program b runs `_finish_row` (kv_norm over d,
   RoPE of the last 2R channels, Hadamard, target, packed row) on pooled[b], the fp32 values the
   decode kernel holds in registers at that point, for the rows of all groups at once (launched
   with PDL while the pooling drains; it waits for all of it).

Bits: the rows, states and journal equal G launches of the decode kernel bit for bit when every
fp32 sum adds in the decode kernel's order, which its thread layout fixes. The decode kernel's 4
warps lie BLOCK_D / 128 along the channels (4 channels a thread, 32 lanes) and the rest along the r
rows of its [r, BLOCK_D] tiles (d 512: the rows in registers; d 128: one row a warp, summed across
warps). `launch_warps` gives a 128-channel slice the row warps (d 512: 1; d 128: 4) and the finish
the channel warps (4; 1), whose 1-D row layout is then the decode kernel's pooled row (its row
warps held copies): the same column sums and the same kv_norm sum (tests/test_codegen.py checks the
TTGIR at d 512 and 128, V4's widths; the rest of the finish is elementwise or max). Other widths
get the same math; their sum order across threads is not checked.

Arithmetic (H200, V4-Flash, k = 3, G = 4; measured: 12.6 µs a launch at c = 1, 14.0 at c = 8, with
one 4-warp program a sequence running pooling and finish in series; the decode kernel's one group
2-3 µs). A group is a chain of dependent round trips (~0.4-0.8 µs each, L2 / HBM): its position ->
bias and open row -> (completing) the block tiles -> stores; then the finish: weight, cos, sin,
rows_of -> kv_norm (a CTA reduction) -> RoPE -> block scales (reductions) -> stores; ~2.8 µs a group
in series. Slicing does not shorten a group's pooling chain (it cuts a program's bytes: CSA, a
completing group, ~100 -> ~25 KiB); what it buys is the finish out of the serial loop, one position
round trip fewer a group, and 4x the programs issuing: pooling ~G x 1.0-1.2 µs, then one finish for
all G * S rows (~1.5 µs after the drain). Predicted ~6-7 µs a verify call (two launches) at c = 1;
measured (session 17, H200, 42 calls of a 30-layer k = 3 verify step): pooling 334 + finish 99 =
433 µs at c = 1 (~10.3 µs a call, against 12.6 for the one-kernel version), 348 + 102 = 450 at
c = 8 (~10.7, against 14.0): the G groups' pooling chain in series stays the floor of this split,
~8 µs a call. A last-arriving program a sequence (an atomic
ticket) would save the second launch but finish the G rows in series (G x ~1.2 µs, more than the
PDL gap) and need a counter the caller keeps.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.compress_decode_triton import (DECODE_WARPS, _finish_row, _pool_online_step, _pool_overlap_step,
                                                launch_layout)

CHANNELS_PER_PROGRAM = 128  # a pooling program's slice: 4 channels a thread over one warp's 32 lanes


def launch_warps(block_d: int) -> tuple[int, int]:
    """(pooling warps, finish warps) at a row width BLOCK_D: the decode kernel's 4 warps lie
    BLOCK_D / 128 along the channels and the rest along the r rows of its tiles; a 128-channel
    slice with the row warps (4 * 128 / BLOCK_D) gets its per-channel layout, and a finish with
    the channel warps (BLOCK_D / 128) the layout of its pooled row (docstring, "Bits")."""
    along_channels = max(1, min(DECODE_WARPS, block_d // CHANNELS_PER_PROGRAM))
    return DECODE_WARPS // along_channels, along_channels


@triton.jit
def _compress_verify_pool_kernel(
    kv_ptr, score_ptr, pos_ptr, slot_ptr, bias_ptr, s0_ptr, s1_ptr, s2_ptr, pooled_ptr, saved_ptr, written_ptr,
    S, groups, d, stride_in, stride_slot, stride_saved, stride_written,
    RATIO: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, SAVE: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    seq = tl.program_id(0).to(tl.int64)
    first_slice = tl.program_id(1) == 0
    slot = tl.load(slot_ptr + seq).to(tl.int64)
    state0, state1, state2 = s0_ptr + slot * stride_slot, s1_ptr + slot * stride_slot, s2_ptr + slot * stride_slot
    n: tl.constexpr = 2 if OVERLAP else 3
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    ch_ok = ch < d
    p = tl.load(pos_ptr + seq)
    for g in range(groups):
        b = g * S + seq
        # the next group's position, in flight during this group (its bias row and open row depend on it)
        p_next = tl.load(pos_ptr + b + S, mask=g + 1 < groups, other=0)
        j = p % RATIO
        complete = j == RATIO - 1
        journal = g > 0
        undo = saved_ptr + (g - 1) * stride_saved + seq * n * stride_slot  # saved[g - 1], entry seq * n
        if OVERLAP:
            row = _pool_overlap_step(kv_ptr, score_ptr, bias_ptr, state0, state1, b, stride_in, j, complete, d, ch,
                                     ch_ok, RATIO, BLOCK_R, BLOCK_C, undo, undo + stride_slot, journal, SAVE)
            mask = (1 << (RATIO + j)) | tl.where(complete, (1 << RATIO) - 1, 0)
        else:
            row = _pool_online_step(kv_ptr, score_ptr, bias_ptr, state0, state1, state2, b, stride_in, j, complete,
                                    d, ch, ch_ok, undo, undo + stride_slot, undo + 2 * stride_slot, journal, SAVE)
            mask = tl.full((), 1, tl.int32)  # the one sub-row
        if SAVE:
            if journal & first_slice:
                tl.store(written_ptr + (g - 1) * stride_written + seq, mask.to(tl.int32))
        tl.store(pooled_ptr + b * d + ch, row, mask=ch_ok)
        p = p_next
        tl.debug_barrier()  # the group's state writes, visible to every thread of the program


@triton.jit
def _compress_verify_finish_kernel(
    pooled_ptr, pos_ptr, w_ptr, cos_ptr, sin_ptr, rows_of_ptr, rows_ptr, target_ptr, pool_ptr,
    d, R, scratch, eps, stride_rows_of, stride_cs, stride_pool,
    RATIO: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
    HADAMARD: tl.constexpr = False, LOG2_D: tl.constexpr = 0, PACKED: tl.constexpr = False,
    PK_FP4: tl.constexpr = False, PK_NQ: tl.constexpr = 0, PK_BLOCK: tl.constexpr = 1,
    PK_TAIL_OFF: tl.constexpr = 0, PK_SCALE_OFF: tl.constexpr = 0, PK_HAS_TAIL: tl.constexpr = False,
    PK_PAYLOAD: tl.constexpr = 0, PK_ROW_BYTES: tl.constexpr = 0,
):
    if PDL:
        gdc_wait()  # the pooling launch has finished: every slice of every pooled row is written
    b = tl.program_id(0).to(tl.int64)
    p = tl.load(pos_ptr + b)
    complete = p % RATIO == RATIO - 1
    ch = tl.arange(0, BLOCK_D)
    ch_ok = ch < d
    row = tl.load(pooled_ptr + b * d + ch, mask=ch_ok, other=0.0)
    _finish_row(row, b, p, complete, ch, ch_ok, d, R, eps, w_ptr, cos_ptr, sin_ptr, stride_cs, rows_ptr,
                rows_of_ptr, stride_rows_of, target_ptr, scratch, pool_ptr, stride_pool, RATIO, BLOCK_D,
                HADAMARD, LOG2_D, PACKED, PK_FP4, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                PK_PAYLOAD, PK_ROW_BYTES)


def compress_verify_triton(kv, score, positions, slots, position_bias, state, ratio, norm_weight, eps, cos, sin,
                           rows_of, scratch, out_dtype, groups, saved=None, written=None, pool=None, row_format=None,
                           hadamard=False):
    s, d = slots.shape[0], norm_weight.shape[0]
    rows = torch.empty(groups * s, d, dtype=out_dtype, device=kv.device)
    target = torch.empty(groups * s, dtype=torch.int64, device=kv.device)
    if s == 0:
        return rows, target
    overlap, s0, s1, s2, pk, block_d = launch_layout(state, d, pool, row_format)
    pooled = torch.empty(groups * s, d, dtype=torch.float32, device=kv.device)
    block_c = min(block_d, CHANNELS_PER_PROGRAM)
    pool_warps, finish_warps = launch_warps(block_d)
    _compress_verify_pool_kernel[(s, triton.cdiv(d, block_c))](
        kv, score, positions, slots, position_bias, s0, s1, s2, pooled,
        s0 if saved is None else saved, target if written is None else written,
        s, groups, d, kv.stride(0), s0.stride(0), 0 if saved is None else saved.stride(0),
        0 if written is None else written.stride(0),
        RATIO=ratio, OVERLAP=overlap, BLOCK_R=triton.next_power_of_2(ratio) if overlap else 1, BLOCK_C=block_c,
        # num_stages 1: the groups loop is sequential (each group reads the state the last one wrote)
        SAVE=saved is not None, num_warps=pool_warps, num_stages=1, **pdl_launch(kv),
    )
    _compress_verify_finish_kernel[(groups * s,)](
        pooled, positions, norm_weight, cos, sin, rows_of, rows, target, rows if pool is None else pool,
        d, cos.shape[1], scratch, float(eps), rows_of.stride(0), cos.stride(0), 0 if pool is None else pool.stride(0),
        RATIO=ratio, BLOCK_D=block_d, num_warps=finish_warps, **pdl_launch(kv), **pk,
        **(dict(HADAMARD=True, LOG2_D=d.bit_length() - 1) if hadamard else {}),
    )
    return rows, target
