"""Triton kernels of a verify step's compressor steps (math: compress_verify_reference.py).

Layouts as compress_decode_triton.py, with G * S token rows (group-major: token g * S + b is
sequence b's g-th) for kv, score, positions, cos, sin, rows_of, rows and target; slots [S] int64;
every state tensor [slots, *row] with contiguous rows, a row being `sub` sub-rows of w floats
(overlap: 2r rows of W = 2d; online: one row of d). The rollback's journal: saved [G, S_max * n,
*row] fp32 (entry b * n + t: tensor t of sequence b) and written [G, S_max] int32. Between the two
launches: pooled [G * S, d] fp32, the pooled rows (token order; zeros or an open block's partial
pool where no block completes: the finish masks them).

Two launches, splitting the work where its dependencies split:

1. `_compress_verify_pool_kernel`, grid (S, C): program (b, c) owns channels [c * BLOCK_C,
   (c + 1) * BLOCK_C) of sequence b, i.e. state elements x * w + ch and (overlap) x * w + d + ch of
   every sub-row x, and runs its G groups in order, each exactly `_compress_decode_kernel`'s
   pooling step (`_pool_overlap_step` / `_pool_online_step`) on the slice. The pooling and the
   state update are per channel (the softmax over the 2r candidates runs down a channel), so a
   slice's rows and states are the decode kernel's bits: BLOCK_C = 128 at one warp gives the
   [r, 128] tiles the decode kernel's [r, 512] thread layout (4 channels a thread, the r rows in
   registers: the column sums are the same in-thread sums, in row order). Group g >= 1 first
   journals what it is about to overwrite, on its slice only (UNDO): the sub-rows' values after
   group g - 1 go to saved[g - 1] at their own offsets, and written[g - 1, b] gets their bit mask
   (one value for all slices, stored by slice 0):

       overlap: 1 << (r + j)  |  (2^r - 1 when the block completes: the previous block's rows)
       online:  1             (every group rewrites max, sum and acc)

   Each pre-image is loaded by the thread that then overwrites it (beside the step's own loads, or
   from its registers), so the journal adds stores, not a dependent load -> store loop; a CTA
   barrier separates a group's state writes from the next group's reads. The pooled row goes to
   pooled[g * S + b, slice].
2. `_compress_verify_finish_kernel`, grid (G * S,): program b finishes token row b:
   `_finish_row` (kv_norm over d, RoPE of the last 2R channels, Hadamard, target, packed row) on
   pooled[b], the same fp32 values the decode kernel holds in registers, at the decode kernel's
   BLOCK_D and 4 warps: its bits. It runs on the rows of all groups at once (PDL: launched while
   the pooling drains).

Why this split (H200, V4-Flash, k = 3, G = 4; measured 12.6 µs a launch with one program a
sequence running pooling and finish in series): a group is a chain of dependent memory round
trips (position -> bias, open row -> block tiles -> stores; ~0.5-0.8 µs each from L2 / HBM) and,
in the finish, four block reductions over d (norm, packed block scales, with CTA barriers) before
its stores. Slicing the channels does not shorten a group's chain, but it moves each program's
bytes from ~100 KiB (CSA, a completing group: tiles of 2r x 2d x 2 tensors) to ~25 KiB, and the
finish leaves the serial loop: G x (pool + finish) ~ 4 x (1.2 + 1.2) µs becomes G x ~1.2 µs for the
pooling plus one finish (~1.5 µs) that all G * S rows run in parallel. Predicted: CSA (d 512, C 4)
~7 µs, indexer (d 128, C 1, Hadamard in the finish) ~6 µs, HCA (online, C 4) ~6 µs a verify call at
c = 1 (two launches); c = 8 (32 pooling programs, 32 finish programs, both under the 132 SMs) the
same +10%. A last-arriving program per sequence (an atomic ticket) would save the second launch
but finish the G rows in series (G x ~1.2 µs, more than a PDL launch gap), and a caller-kept
counter per sequence.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.compress_decode_triton import _finish_row, _pool_online_step, _pool_overlap_step, launch_layout

CHANNELS_PER_PROGRAM = 128  # a pooling program's slice: 4 channels a thread over one warp's 32 lanes
DECODE_WARPS = 4  # compress_decode_triton's launch, whose thread layouts the two kernels reproduce


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
    for g in range(groups):
        b = g * S + seq
        p = tl.load(pos_ptr + b)
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
