"""Triton kernel of a verify step's compressor steps (math: compress_verify_reference.py).

Layouts as compress_decode_triton.py, with G * S token rows (group-major: token g * S + b is
sequence b's g-th) for kv, score, positions, cos, sin, rows_of, rows and target; slots [S] int64;
saved (the rollback's checkpoints) [G, S_max * n, *state row] in the state's dtype (fp32), row
b * n + t for state tensor t of sequence b; every state tensor [slots, *row] with contiguous rows.

One program per sequence runs the sequence's G decode steps in order, each exactly
`_compress_decode_kernel`'s (`_pool_overlap_step` / `_pool_online_step`, then `_finish_row`), so
the rows and states are bit-identical to G launches of it. After group g it copies the slot's
state rows (n x row floats, 16-byte vectors, BLOCK_COPY a step) to saved[g]: the checkpoint the
commit restores after g accepted drafts. A CTA barrier separates a group's state writes from the
copy and the copy from the next group's writes (threads of the program touch different elements
in the pooling tiles, the row vectors and the copy). One launch replaces G compressor launches
and G state gathers per compressor (30-layer Flash, k = 3: 42 launches instead of 168 + 168).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.compress_decode_triton import _finish_row, _pool_online_step, _pool_overlap_step, launch_layout

BLOCK_COPY = 1024  # floats a copy step: 4 warps x 32 threads x 8 (two 16-byte vectors each)


@triton.jit
def _copy_floats(src, dst, numel, BLOCK_COPY: tl.constexpr):
    for start in range(0, numel, BLOCK_COPY):
        offs = start + tl.arange(0, BLOCK_COPY)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < numel), mask=offs < numel)


@triton.jit
def _compress_verify_kernel(
    kv_ptr, score_ptr, pos_ptr, slot_ptr, bias_ptr, s0_ptr, s1_ptr, s2_ptr,
    w_ptr, cos_ptr, sin_ptr, rows_of_ptr, rows_ptr, target_ptr, pool_ptr, saved_ptr,
    S, groups, d, R, scratch, eps, stride_in, stride_slot, stride_rows_of, stride_cs, stride_pool, stride_saved,
    RATIO: tl.constexpr, OVERLAP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
    SAVE: tl.constexpr, BLOCK_COPY: tl.constexpr, PDL: tl.constexpr = False,
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
    ch = tl.arange(0, BLOCK_D)
    ch_ok = ch < d
    for g in range(groups):
        b = g * S + seq
        p = tl.load(pos_ptr + b)
        j = p % RATIO
        complete = j == RATIO - 1
        if OVERLAP:
            row = _pool_overlap_step(kv_ptr, score_ptr, bias_ptr, state0, state1, b, stride_in, j, complete, d, ch,
                                     ch_ok, RATIO, BLOCK_R, BLOCK_D)
        else:
            row = _pool_online_step(kv_ptr, score_ptr, bias_ptr, state0, state1, state2, b, stride_in, j, complete,
                                    d, ch, ch_ok)
        _finish_row(row, b, p, complete, ch, ch_ok, d, R, eps, w_ptr, cos_ptr, sin_ptr, stride_cs, rows_ptr,
                    rows_of_ptr, stride_rows_of, target_ptr, scratch, pool_ptr, stride_pool, RATIO, BLOCK_D,
                    HADAMARD, LOG2_D, PACKED, PK_FP4, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                    PK_PAYLOAD, PK_ROW_BYTES)
        tl.debug_barrier()  # the group's state writes, visible to every thread of the program
        if SAVE:
            n: tl.constexpr = 2 if OVERLAP else 3
            saved = saved_ptr + g * stride_saved + seq * n * stride_slot
            _copy_floats(state0, saved, stride_slot, BLOCK_COPY)
            _copy_floats(state1, saved + stride_slot, stride_slot, BLOCK_COPY)
            if not OVERLAP:
                _copy_floats(state2, saved + 2 * stride_slot, stride_slot, BLOCK_COPY)
            tl.debug_barrier()  # the copy has read the state before the next group rewrites it


def compress_verify_triton(kv, score, positions, slots, position_bias, state, ratio, norm_weight, eps, cos, sin,
                           rows_of, scratch, out_dtype, groups, saved=None, pool=None, row_format=None,
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
        s0 if saved is None else saved,
        s, groups, d, cos.shape[1], scratch, float(eps), kv.stride(0), s0.stride(0), rows_of.stride(0),
        cos.stride(0), 0 if pool is None else pool.stride(0), 0 if saved is None else saved.stride(0),
        RATIO=ratio, OVERLAP=overlap, BLOCK_R=triton.next_power_of_2(ratio) if overlap else 1,
        # num_stages 1: the groups loop is sequential (each group reads the state the last one wrote)
        BLOCK_D=block_d, SAVE=saved is not None, BLOCK_COPY=BLOCK_COPY, num_warps=4, num_stages=1, **pdl_launch(kv),
        **pk,
        **(dict(HADAMARD=True, LOG2_D=d.bit_length() - 1) if hadamard else {}),
    )
    return rows, target
