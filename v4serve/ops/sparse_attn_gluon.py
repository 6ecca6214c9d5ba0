"""Warp-specialised sparse attention for Hopper (sm_90), written in Gluon.

Same math and layouts as sparse_attn_triton.py (q [T, H, D] bf16, pools [N, D] bf16 with one
16-byte aligned row stride, idx [T, C] int32 with -1 holes, counts [T] int32, sink [H] fp32,
out [T, H, D] bf16), for D = 512 and any H (64-head blocks):

    s_c = qk_scale_log2 * q[t, h] . kv_c,   m = max(sink2, max_c s_c),
    o   = sum_c 2^(s_c - m) kv_c / (sum_c 2^(s_c - m) + 2^(sink2 - m)).

Why a second kernel. The `tl` kernel's program (one token, 64 heads) holds a [64, 512] fp32
accumulator that fills an SM's registers, so one program per SM runs its chain - Q load, gather,
S = Q K^T, softmax, P V, store - with nothing to overlap it (Nsight Compute: 2 warps per scheduler
issuing every 3.5 cycles; docs/performance.md item 9). Here one persistent program per SM splits
that chain over three partitions that run at once:

- producer (4 warps, 24 registers): per work item (token, 64-head block, column split) it copies
  Q [64, D] and then each BLOCK_T-column KV tile (rows gathered through idx, holes zero-filled,
  plus the tile's idx entries) into shared memory with cp.async, 16 bytes per KV copy, and
  signals a `ready` mbarrier when its copies land (cp.async.mbarrier.arrive). Q has one buffer,
  KV tiles a ring of KV_STAGES buffers; the producer waits on the matching `empty` mbarrier
  before it overwrites one, so it runs up to KV_STAGES tiles and one Q ahead.
- two consumers (4 warps = one warpgroup each, 240 registers): both compute the full S tile
  [64 heads, BLOCK_T] with wgmma (so each owns whole softmax rows: no cross-warp reductions),
  and each accumulates half of the output dims, acc [64, D / 2] fp32 in registers, with P taken
  from registers as wgmma's A operand. A consumer releases Q after the item's last S and each
  KV buffer after its P V, so the producer loads the next item while the consumers finish this
  one. The output half is staged through the consumer's half of the item's last KV buffer (once
  both consumers have released Q, i.e. finished reading that buffer's K) and written with
  16-byte stores; only then is that buffer released.

Split mode (SPLIT, decode): a work item covers columns [split * cols_per_split, ...) and stores
its unnormalised fp32 state (acc, m, l) for sparse_attn_triton's merge kernel.

Shared memory: Q 64 KB + KV_STAGES x [BLOCK_T, D] bf16 (2 x 64 KB) + the tiles' idx = 193 KB of
the 227 KB. Phases: every partition walks the same work list (work = pid, pid + n_programs, ...)
and counts its Q uses and KV tiles, so the i-th tile sits in buffer i % KV_STAGES with mbarrier
parity (i // KV_STAGES) & 1; a producer waits for the `empty` parity before that (a fresh
barrier counts as having completed the phase before its first). Each partition loads the next
item's column bound (counts) one item ahead.

Measured on the H200 (docs/performance.md item 15): prefill S8192 r4 / r128 / r0 1.79 / 0.72 /
0.58 ms against 2.81 / 1.13 / 0.87 ms for the `tl` kernel, outputs bit-identical at the PR
shapes; as a decode kernel (split mode) it loses to the `tl` split kernel at every shape, so
decode stays there. Production for prefill on sm_90 under Triton 3.6 (the version timed); it
compiles under 3.8 and 3.9 (codegen check). The `tl` kernel stays the portable path and the one
CPU tests run: the interpreter does not run Gluon.
"""

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from v4serve.ops.gluon_builtins import barrier, cp_async


WS_HEAD_DIM = 512  # the one head dim this kernel takes (DeepSeek-V4's)

BLOCK_H = gl.constexpr(64)  # heads per work item: wgmma's M
PRODUCER_WARPS = gl.constexpr(4)
CONSUMER_WARPS = gl.constexpr(4)  # one warpgroup per consumer; the default partition is consumer 0
# Registers per thread: 384 threads x MAX_REGS = 64.5K of the SM's 64K pool; the producer gives
# back all but 24 and the default partition receives what the workers leave (240).
MAX_REGS = 168
PRODUCER_REGS = gl.constexpr(24)
CONSUMER_REGS = gl.constexpr(240)
TILE_CONFIG = dict(BLOCK_T=64, KV_STAGES=2)


@gluon.jit
def _column_bound(work, shape, counts_ptr, HAS_COUNTS: gl.constexpr):
    """End of the live columns of work item `work`'s token (C without counts). The partitions
    load it one item ahead, so its latency overlaps the item before; past the end of the work
    list the load is masked and the value unused."""
    H, C, n_window, n_hblocks, n_splits, cols_per_split, n_work = shape
    bound = C
    if HAS_COUNTS:
        tok = (work // (n_hblocks * n_splits)).to(gl.int64)
        count = gl.load(counts_ptr + tok, mask=work < n_work, other=0)
        bound = gl.minimum(C, n_window + gl.maximum(count, 0))
    return bound


@gluon.jit
def _sink2(sink_ptr, work, shape, s_rows):
    """sink * log2(e) of work item `work`'s heads (loaded one item ahead, like the bound)."""
    H, C, n_window, n_hblocks, n_splits, cols_per_split, n_work = shape
    heads = work // n_splits % n_hblocks * BLOCK_H + s_rows
    return gl.load(sink_ptr + heads, mask=heads < H, other=0.0) * 1.4426950408889634


@gluon.jit
def _work_item(work, shape, bound, BLOCK_T: gl.constexpr):
    """(token, head block, split, first and end column, number of KV tiles) of work item `work`."""
    H, C, n_window, n_hblocks, n_splits, cols_per_split, n_work = shape
    tok = (work // (n_hblocks * n_splits)).to(gl.int64)
    hblock = work // n_splits % n_hblocks
    split = work % n_splits
    lo = split * cols_per_split
    hi = gl.minimum(bound, lo + cols_per_split)
    return tok, hblock, split, lo, hi, (gl.maximum(hi - lo, 0) + BLOCK_T - 1) // BLOCK_T


@gluon.jit
def _producer(ptrs, shape, strides, bufs,
              HAS_COUNTS: gl.constexpr, BLOCK_T: gl.constexpr, D: gl.constexpr, KV_STAGES: gl.constexpr):
    q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, part_ptr, m_ptr, l_ptr = ptrs
    H, C, n_window, n_hblocks, n_splits, cols_per_split, n_work = shape
    stride_qt, stride_qh, stride_pool, stride_it, stride_ot, stride_oh, stride_pt, stride_ps, stride_ph, \
        stride_mt, stride_ms = strides
    q_smem, kv_smem, rows_smem, q_ready, q_empty, kv_ready, kv_empty = bufs
    # 16-byte copies (8 bf16); 8 threads cover 128 contiguous bytes of a row and each thread walks
    # its row in 128-byte steps, so a thread needs few row pointers (the partition runs on 24
    # registers) and the column offsets fold into the copy instruction.
    gather: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    dims = gl.arange(0, D, layout=gl.SliceLayout(0, gather))
    q_rows = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, gather))
    tile_cols = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, gather))
    row_ids = gl.arange(0, BLOCK_T, layout=gl.BlockedLayout([1], [32], [PRODUCER_WARPS], [0]))
    n_items = 0
    n_tiles = 0
    next_bound = _column_bound(gl.program_id(0), shape, counts_ptr, HAS_COUNTS)
    for work in range(gl.program_id(0), n_work, gl.num_programs(0)):
        tok, hblock, split, lo, hi, tiles = _work_item(work, shape, next_bound, BLOCK_T)
        next_bound = _column_bound(work + gl.num_programs(0), shape, counts_ptr, HAS_COUNTS)
        heads = hblock * BLOCK_H + q_rows
        mbarrier.wait(q_empty, (n_items & 1) ^ 1)
        q_ptrs = q_ptr + tok * stride_qt + heads[:, None] * stride_qh + dims[None, :]
        cp_async(q_smem, q_ptrs, mask=(heads < H)[:, None])
        async_copy.mbarrier_arrive(q_ready, increment_count=False)
        n_items += 1
        for start in range(lo, hi, BLOCK_T):
            cols = start + tile_cols
            rows = gl.load(idx_ptr + tok * stride_it + cols, mask=cols < hi, other=-1)
            # NOTE: the hint keeps the gather at 16-byte copies (the select loses the pointer alignment).
            base = gl.multiple_of(gl.where(cols < n_window, win_ptr, cmp_ptr), 16)
            kv_ptrs = base[:, None] + rows.to(gl.int64)[:, None] * stride_pool + dims[None, :]
            stage = n_tiles % KV_STAGES
            mbarrier.wait(kv_empty.index(stage), ((n_tiles // KV_STAGES) & 1) ^ 1)
            cp_async(kv_smem.index(stage), kv_ptrs, mask=(rows >= 0)[:, None])
            # The tile's row ids for the consumers' hole mask (past the bound: zero-filled, masked there).
            idx_cols = start + row_ids
            cp_async(rows_smem.index(stage), idx_ptr + tok * stride_it + idx_cols, mask=idx_cols < hi)
            async_copy.mbarrier_arrive(kv_ready.index(stage), increment_count=False)
            n_tiles += 1


@gluon.jit
def _consumer(HALF: gl.constexpr, ptrs, shape, strides, bufs, qk_scale_log2,
              HAS_COUNTS: gl.constexpr, SPLIT: gl.constexpr, BLOCK_T: gl.constexpr, D: gl.constexpr,
              KV_STAGES: gl.constexpr):
    q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, part_ptr, m_ptr, l_ptr = ptrs
    H, C, n_window, n_hblocks, n_splits, cols_per_split, n_work = shape
    stride_qt, stride_qh, stride_pool, stride_it, stride_ot, stride_oh, stride_pt, stride_ps, stride_ph, \
        stride_mt, stride_ms = strides
    q_smem, kv_smem, rows_smem, q_ready, q_empty, kv_ready, kv_empty = bufs
    DV: gl.constexpr = D // 2  # this consumer's output dims: [HALF * DV, (HALF + 1) * DV)
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[CONSUMER_WARPS, 1],
                                                       instr_shape=[16, BLOCK_T, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[CONSUMER_WARPS, 1],
                                                       instr_shape=[16, DV, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    store_layout: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [CONSUMER_WARPS, 1], [1, 0])
    STAGE_OUT: gl.constexpr = not SPLIT and BLOCK_T >= BLOCK_H
    tile_cols = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, s_layout))
    s_rows = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    o_rows = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    o_dims = HALF * DV + gl.arange(0, DV, layout=gl.SliceLayout(0, o_layout))
    n_items = 0
    n_tiles = 0
    next_bound = _column_bound(gl.program_id(0), shape, counts_ptr, HAS_COUNTS)
    next_sink = _sink2(sink_ptr, gl.program_id(0), shape, s_rows)
    for work in range(gl.program_id(0), n_work, gl.num_programs(0)):
        tok, hblock, split, lo, hi, tiles = _work_item(work, shape, next_bound, BLOCK_T)
        s_heads = hblock * BLOCK_H + s_rows
        sink = next_sink
        next_bound = _column_bound(work + gl.num_programs(0), shape, counts_ptr, HAS_COUNTS)
        next_sink = _sink2(sink_ptr, work + gl.num_programs(0), shape, s_rows)
        m_i = sink
        l_i = gl.zeros([BLOCK_H], gl.float32, layout=gl.SliceLayout(1, s_layout))
        acc = gl.zeros([BLOCK_H, DV], gl.float32, layout=o_layout)
        mbarrier.wait(q_ready, n_items & 1)
        n_items += 1
        mbarrier.arrive(q_empty, pred=tiles == 0)  # no S to compute: Q is free at once
        for j in range(0, tiles):
            stage = n_tiles % KV_STAGES
            kv = kv_smem.index(stage)
            mbarrier.wait(kv_ready.index(stage), (n_tiles // KV_STAGES) & 1)
            fence_async_shared()  # cp.async wrote the tile through the generic proxy; wgmma reads it async
            s = warpgroup_mma(q_smem, kv.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_T], gl.float32, s_layout),
                              use_acc=False, is_async=True)
            s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
            mbarrier.arrive(q_empty, pred=j == tiles - 1)  # the item's last S: Q may be replaced
            # Live columns: a pool row (not a -1 hole) below the item's column bound.
            live = (rows_smem.index(stage).load(tile_cols.type.layout) >= 0) & (lo + j * BLOCK_T + tile_cols < hi)
            s = gl.where(live[None, :], s * qk_scale_log2, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 1))
            alpha = gl.exp2(m_i - m_new)
            p = gl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + gl.sum(p, 1)
            m_i = m_new
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))[:, None]
            p_op = gl.convert_layout(p.to(gl.bfloat16), p_layout)
            acc = warpgroup_mma(p_op, kv.slice(HALF * DV, DV, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
            # The item's last buffer stays ours when the output is staged through it (below).
            mbarrier.arrive(kv_empty.index(stage), pred=not STAGE_OUT or j < tiles - 1)
            n_tiles += 1
        o_heads = hblock * BLOCK_H + o_rows
        o_mask = (o_heads < H)[:, None]
        if STAGE_OUT:
            # Written from the wgmma layout, each thread would issue 64 4-byte stores (36% of the
            # consumers' time in Nsight Compute); instead the output half goes through this
            # consumer's half of the item's last KV buffer and out in 16-byte stores. Both
            # consumers must be done with that buffer's K first: the item's Q release says so.
            inv_l = gl.convert_layout(1.0 / (l_i + gl.exp2(sink - m_i)), gl.SliceLayout(1, o_layout))
            o = (acc * inv_l[:, None]).to(gl.bfloat16)
            if tiles > 0:
                last = (n_tiles - 1) % KV_STAGES
                staging = kv_smem.index(last).slice(HALF * DV, DV, dim=1)
                mbarrier.wait(q_empty, (n_items - 1) & 1)
                staging.store(o)
                barrier()  # the partition's stores are in shared memory before any thread reads
                o_rows16 = hblock * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, store_layout))
                o_dims16 = HALF * DV + gl.arange(0, DV, layout=gl.SliceLayout(0, store_layout))
                gl.store(out_ptr + tok * stride_ot + o_rows16[:, None] * stride_oh + o_dims16[None, :],
                         staging.load(store_layout), mask=(o_rows16 < H)[:, None])
                mbarrier.arrive(kv_empty.index(last))
            else:
                gl.store(out_ptr + tok * stride_ot + o_heads[:, None] * stride_oh + o_dims[None, :], o, mask=o_mask)
        elif SPLIT:
            # This split's unnormalised state for the merge kernel (m and l once, from consumer 0).
            gl.store(part_ptr + tok * stride_pt + split * stride_ps + o_heads[:, None] * stride_ph + o_dims[None, :],
                     acc, mask=o_mask)
            if HALF == 0:
                ml_offs = tok * stride_mt + split * stride_ms + s_heads
                gl.store(m_ptr + ml_offs, m_i, mask=s_heads < H)
                gl.store(l_ptr + ml_offs, l_i, mask=s_heads < H)
        else:
            inv_l = gl.convert_layout(1.0 / (l_i + gl.exp2(sink - m_i)), gl.SliceLayout(1, o_layout))
            gl.store(out_ptr + tok * stride_ot + o_heads[:, None] * stride_oh + o_dims[None, :],
                     (acc * inv_l[:, None]).to(gl.bfloat16), mask=o_mask)


@gluon.jit
def _sparse_attn_ws_kernel(
    q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, part_ptr, m_ptr, l_ptr,
    H, C, n_window, n_hblocks, n_splits, cols_per_split, n_work, qk_scale_log2,
    stride_qt, stride_qh, stride_pool, stride_it, stride_ot, stride_oh,
    stride_pt, stride_ps, stride_ph, stride_mt, stride_ms,
    HAS_COUNTS: gl.constexpr, SPLIT: gl.constexpr, BLOCK_T: gl.constexpr, D: gl.constexpr,
    KV_STAGES: gl.constexpr,
):
    smem_layout: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
    bar_layout: gl.constexpr = mbarrier.MBarrierLayout()
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D], smem_layout)
    kv_smem = gl.allocate_shared_memory(gl.bfloat16, [KV_STAGES, BLOCK_T, D], smem_layout)
    rows_smem = gl.allocate_shared_memory(gl.int32, [KV_STAGES, BLOCK_T], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    q_ready = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    q_empty = gl.allocate_shared_memory(gl.int64, [1], bar_layout)
    kv_ready = gl.allocate_shared_memory(gl.int64, [KV_STAGES, 1], bar_layout)
    kv_empty = gl.allocate_shared_memory(gl.int64, [KV_STAGES, 1], bar_layout)
    # `ready` completes when every producer thread's copies have landed (cp.async arrive, no
    # increment); `empty` when both consumers have arrived.
    mbarrier.init(q_ready, count=PRODUCER_WARPS * 32)
    mbarrier.init(q_empty, count=2)
    for i in gl.static_range(KV_STAGES):
        mbarrier.init(kv_ready.index(i), count=PRODUCER_WARPS * 32)
        mbarrier.init(kv_empty.index(i), count=2)
    ptrs = (q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, part_ptr, m_ptr, l_ptr)
    shape = (H, C, n_window, n_hblocks, n_splits, cols_per_split, n_work)
    strides = (stride_qt, stride_qh, stride_pool, stride_it, stride_ot, stride_oh, stride_pt, stride_ps, stride_ph,
               stride_mt, stride_ms)
    bufs = (q_smem, kv_smem, rows_smem, q_ready, q_empty, kv_ready, kv_empty)
    # NOTE: constexprs go into the partitions' argument tuples directly: a tuple assigned to a name
    # first turns its constexprs into tensors.
    gl.warp_specialize([
        (_consumer, (0, ptrs, shape, strides, bufs, qk_scale_log2, HAS_COUNTS, SPLIT, BLOCK_T, D, KV_STAGES)),
        (_consumer, (1, ptrs, shape, strides, bufs, qk_scale_log2, HAS_COUNTS, SPLIT, BLOCK_T, D, KV_STAGES)),
        (_producer, (ptrs, shape, strides, bufs, HAS_COUNTS, BLOCK_T, D, KV_STAGES)),
    ], [CONSUMER_WARPS, PRODUCER_WARPS], [CONSUMER_REGS, PRODUCER_REGS])


def sparse_attn_ws(qt, win, cmp, it, ct, sink, out, part, m_part, l_part, n_window, cols_per_split, n_splits,
                   qk_scale_log2, has_counts, n_sms, tile_config=None):
    """Launch on [T, H, D] views as sparse_attn_triton.py prepares them (D = WS_HEAD_DIM). With
    n_splits > 1 it writes the split partials (part, m_part, l_part) for the merge kernel."""
    cfg = dict(TILE_CONFIG if tile_config is None else tile_config)
    T, H, D = qt.shape
    C = it.shape[1]
    n_hblocks = triton.cdiv(H, BLOCK_H)
    n_work = T * n_hblocks * n_splits
    split = n_splits > 1
    part_strides = (part.stride(0), part.stride(1), part.stride(2), m_part.stride(0), m_part.stride(1)) if split \
        else (0, 0, 0, 0, 0)
    _sparse_attn_ws_kernel[(min(n_work, n_sms),)](
        qt, win, cmp, it, ct, sink, out, part, m_part, l_part,
        H, C, n_window, n_hblocks, n_splits, cols_per_split, n_work, qk_scale_log2,
        qt.stride(0), qt.stride(1), win.stride(0), it.stride(0), out.stride(0), out.stride(1), *part_strides,
        HAS_COUNTS=has_counts, SPLIT=split, D=D, num_warps=CONSUMER_WARPS, maxnreg=MAX_REGS, **cfg,
    )
    return out
