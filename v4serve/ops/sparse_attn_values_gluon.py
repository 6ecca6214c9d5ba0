"""The two-pass decode's values pass over packed fp8 rows, in Gluon (sm_90; issue 17): the contract and
math of sparse_attn_two_pass.py's values pass (read its docstring first),

    m = max(sink2, max_j m_j),   f_j = 2^(m_j - m),
    o[t, h, dims] = sum_j f_j (p_j @ kv_j[:, dims]) / (sum_j f_j l_j + 2^(sink2 - m)),

for `fp8_e8m0_b64_rope64` rows (DeepSeek-V4's main and window rows at D 512: e4m3 codes of channels
0..447 in bytes 0..447, the bf16 RoPE channels 448..511 in bytes 448..575, the ue8m0 scale of channels
[64 g, 64 g + 64) in byte 576 + g; kv_pack_triton.py), with the tile's bytes brought in by cp.async. A sweep variant, not production: measured on the H200
(session 23) it is correct but slower than the `tl` pass (r4 B8 values pass 11.8 µs, 9.2 with two
warpgroups, against 8.3): its 64 programs at B8 leave half the SMs idle and too few warps to hide the
tile chain's latency (docs/performance.md "Session 23: measured").

Why a second values kernel. The `tl` values pass loads a tile's packed bytes into registers,
dequantizes them, stores the bf16 tile to shared memory (wgmma's B operand), fences it for the async
proxy and runs the dot: every tile's chain (gather -> convert -> store -> fence -> barrier -> MMA) is
serial on one warp a scheduler, 2.4 µs more than the bf16 loop at r4 B8 (docs/performance.md, session
14), whose rows the pipeliner streams into shared memory by cp.async several tiles ahead. Triton does
not pipeline a load that feeds arithmetic before the dot; here the ring is ours:

- a program owns one token, 64 output dims (one scale block of codes, or the bf16 tail) and 64 heads;
  it computes the transposed product out^T [dims, heads] = sum_j f_j kv_j^T p_j^T, so the dequantized
  tile is wgmma's A operand, which wgmma reads from registers (no shared-memory store, no fence), and
  p_j^T is its B operand straight from the cp.async'd p tile;
- a ring of STAGES (4) shared-memory stages holds the tiles' bytes (codes [64 columns, 64 bytes] + the
  scale word of each column, or the tail [64 columns, 64 bf16]), their p tiles [64 heads, 64 columns]
  and maxima m_j [64 heads]: a tile's gathers are issued STAGES - 1 tiles before its wgmma, and their
  latency overlaps the conversions and MMAs between;
- tile j's wgmma runs while tile j + 1 converts (it is waited for after that conversion).

Layouts (4 warps = one warpgroup). wgmma's A fragment [64 rows, 64 k] gives thread (warp w, lane 4g
+ t) rows 16w + g and 16w + g + 8 and, in each k16 step, k = 2t, 2t + 1, 2t + 8, 2t + 9. Row r of A
is output dim 16 (r // 16) + 2 (r % 8) + (r // 8) % 2 (rows g, g + 8 = dims 2g, 2g + 1 of the warp's
16), so a thread's two dims are adjacent bytes of a row: it reads a column's pair with one 16-bit
shared load and decodes it with one e4m3x2 conversion and one bf16x2 scale multiply (both dims share
the column's scale). The register layout `lk` over [64 columns, 64 dims] (registers: dim + 1, column
+ 1, + 8, + 16, + 32; lanes: column + 2, + 4, dim + 2, + 4, + 8; warps: dim + 16, + 32) is that
fragment after the logical reshape [columns, (w, g, u)] -> [(w, u, g), columns]: the conversion to the
dot operand moves no data. The codes' stages are swizzled in 16-byte chunks by (row // 2) % 4, so the
four columns a warp's lanes read (2t: even rows, 64 bytes apart) hit four chunks: no bank conflicts.

Per tile j, in a program's loop (tile j converted by the iteration before): request tile j + 3 (its idx
entries from L1: the prologue read the token's idx row whole; codes / tail and scale words of its pool
rows, holes zero-filled; its p tile and its maxima m_j) into the stage tile j - 1 used; pass a barrier;
issue tile j's m64n64k64 wgmma (4 k16 steps, p^T from shared memory) asynchronously; convert tile j + 1
from its stage meanwhile; wait for the wgmma; acc += 2^(m_j - m) part; then wait until tile j + 2 has
landed, pass a barrier (every thread's copies landed, tile j's stage free for the next request) and
fence them for the async proxy (ordered before the wgmma that reads them by the next barrier). Two
barriers a tile: Triton's membar pass sees a ring as one buffer, and with this order it adds none (a
barrier after cp.async's wait is one it would add itself; the one before the loop keeps it from adding
one before every refill: tile 0's operand is read before the loop). The prologue
reads the live tiles' m_j and l_j for the softmax's max m and denominator. With PDL (the scores pass
launched before this one): the idx row and the first tiles' pool bytes are requested before
griddepcontrol.wait, p, m and l after it.

WARPGROUPS 2 (sweep variant `VALUE_WARPGROUPS=2`): a program's tiles alternate between two warpgroups,
warp-specialised partitions with a ring each (tiles 0, 2, 4, ... and 1, 3, 5, ...), so each chain of
dependent tiles is half as long and each scheduler has two warps to issue from; partition 1 hands its
sum to partition 0 through shared memory (an mbarrier), which adds it and writes the output. 232
registers a thread (maxnreg; 256 threads), 182 KB of shared memory (one warpgroup: 168, 83 KB).

Numerics: the same dequantized values and products as the `tl` values pass; each tile's dot sums its 64
columns in the same k16 steps with the operands' roles swapped (as `KV_OPERAND=KV_LHS`: within fp32
summation order of it), f_j applied to each tile's partial as there (over two warpgroups the partials
are summed in two interleaved halves, then added). The softmax's max and denominator are the same
expressions, reduced in another order (fp32).
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere.async_copy import commit_group, wait_group
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)

from v4serve.ops.gluon_builtins import barrier, cp_async, gdc_wait
from v4serve.ops.packed_rows_gluon import e4m3_scaled_bf16, tile_rows, v4_rows_apply

BLOCK_T = gl.constexpr(64)  # columns a tile: the two-pass tile (wgmma's K)
DIMS = gl.constexpr(64)  # output dims a program: one scale block of codes or the bf16 tail (wgmma's M)
HEADS = gl.constexpr(64)  # heads a program (wgmma's N)
STAGES = 4  # tiles i - 1 (being refilled), i (its wgmma), i + 1 (converting), i + 2 (landed or landing)
MAX_TILES = 32  # the tiles whose softmax stats a program reads at once (sparse_attn_two_pass.VALUES_MAX_TILES)
# WARPGROUPS 2: registers per thread of the kernel (maxnreg) and of the worker partition
MAX_REGS = 232
WORKER_REGS = gl.constexpr(232)


@gluon.jit
def _request_pool(j, stage, tok, hi, n_window, d0, win_ptr, cmp_ptr, idx_ptr, stride_it, stride_pool, scale_word,
                  codes_s, tail_s, scales_s, TAIL: gl.constexpr, PK_TAIL_OFF: gl.constexpr):
    """cp.async tile j's pool bytes into `stage`: the tail [64 columns, 64 bf16] (TAIL), else the codes
    [64 columns, 64 bytes] at channel d0 and each column's scale word (byte offset scale_word)."""
    if TAIL:
        cl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 8 bf16 (16 bytes) a copy
        at, live = tile_rows(j, gl.SliceLayout(1, cl), tok, hi, n_window, win_ptr, cmp_ptr, idx_ptr, stride_it,
                              stride_pool)
        ch = gl.arange(0, DIMS, layout=gl.SliceLayout(0, cl))
        cp_async(tail_s.index(stage), (at + PK_TAIL_OFF).to(gl.pointer_type(gl.bfloat16))[:, None] + ch[None, :],
                  mask=live[:, None])
    else:
        cl: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])  # 16 codes (16 bytes) a copy
        at, live = tile_rows(j, gl.SliceLayout(1, cl), tok, hi, n_window, win_ptr, cmp_ptr, idx_ptr, stride_it,
                              stride_pool)
        ch = d0 + gl.arange(0, DIMS, layout=gl.SliceLayout(0, cl))
        cp_async(codes_s.index(stage), at[:, None] + ch[None, :], mask=live[:, None])
        wl: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])  # a 4-byte copy a column
        at, live = tile_rows(j, wl, tok, hi, n_window, win_ptr, cmp_ptr, idx_ptr, stride_it, stride_pool)
        cp_async(scales_s.index(stage), (at + scale_word).to(gl.pointer_type(gl.int32)), mask=live)


@gluon.jit
def _request_p(j, stage, tok, h0, H, p_ptr, m_ptr, stride_pt, stride_ph, stride_mt, stride_mj, p_s, m_s):
    """cp.async tile j's probabilities p[tok, h0 .. h0 + 64, 64 j .. 64 j + 64] and its maxima m_j[h0 ..
    h0 + 64] into `stage` (the scores pass's outputs)."""
    pl: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])  # 8 bf16 (16 bytes) a copy
    heads = h0 + gl.arange(0, HEADS, layout=gl.SliceLayout(1, pl))
    cols = j * BLOCK_T + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, pl))
    cp_async(p_s.index(stage), p_ptr + stride_pt * tok + heads[:, None] * stride_ph + cols[None, :],
              mask=(heads < H)[:, None])
    ml: gl.constexpr = gl.BlockedLayout([4], [32], [4], [0])  # 4 fp32 (16 bytes) a copy
    heads = h0 + gl.arange(0, HEADS, layout=ml)
    cp_async(m_s.index(stage), m_ptr + stride_mt * tok + j * stride_mj + heads, mask=heads < H)


@gluon.jit
def _dot_operand(vals, a_op: gl.constexpr):
    """bf16 [64 columns, 64 dims] in `lk` -> wgmma's A [64 rows, 64 columns], row r = dim 16 (r // 16) +
    2 (r % 8) + (r // 8) % 2 (dims as (w, g, u) -> rows as (w, u, g)): a renaming of registers."""
    v = gl.permute(gl.reshape(vals, [BLOCK_T, 4, 8, 2]), [1, 3, 2, 0])
    return gl.convert_layout(gl.reshape(v, [DIMS, BLOCK_T]), a_op)


@gluon.jit
def _tile_operand(stage, codes_s, tail_s, scales_s, shift, lk: gl.constexpr, a_op: gl.constexpr, TAIL: gl.constexpr):
    """Tile `stage`'s kv^T as wgmma's A operand: the bf16 tail as it is, else the e4m3 codes times their
    column's scale (the scale word's byte at bit `shift`), exactly."""
    if TAIL:
        vals = tail_s.index(stage).load(lk)
    else:
        vals = e4m3_scaled_bf16(codes_s.index(stage).load(lk), scales_s.index(stage).load(gl.SliceLayout(1, lk)),
                                shift)
    return _dot_operand(vals, a_op)


@gluon.jit
def _values_loop(PART: gl.constexpr, NP: gl.constexpr, n_own, m, tok, hi, d0, h0, ptrs, sizes, strides, scale_word,
                 shift, ring, lk: gl.constexpr, a_op: gl.constexpr, mma: gl.constexpr, TAIL: gl.constexpr,
                 PK_TAIL_OFF: gl.constexpr, STAGES: gl.constexpr):
    """sum_j f_j kv_j^T p_j^T [64 dims (A's rows), 64 heads] over this partition's n_own tiles (j = PART,
    PART + NP, ...), f_j = 2^(m_j - m) (m: the softmax's max, in the heads' layout). Its first STAGES - 1
    tiles are requested, and the first two have landed and are fenced, when it starts. Iteration i:
    request own tile i + STAGES - 1 (into tile i - 1's stage), a barrier, issue tile i's wgmma (its
    operand converted the iteration before), convert tile i + 1 while it runs, wait for it, add f_i
    times it; then wait for tile i + 2, a barrier, and fence it for the async proxy."""
    win_ptr, cmp_ptr, idx_ptr, p_ptr, m_ptr = ptrs
    H, n_window = sizes
    stride_it, stride_pool, stride_pt, stride_ph, stride_mt, stride_mj = strides
    codes_s, tail_s, scales_s, p_s, m_s = ring
    acc = gl.zeros([DIMS, HEADS], gl.float32, mma)
    zero = gl.zeros([DIMS, HEADS], gl.float32, mma)
    a = _tile_operand(0, codes_s, tail_s, scales_s, shift, lk, a_op, TAIL)  # (unused when n_own is 0)
    # Tile 0's reads done before the loop's first refill: with this barrier the loop enters with no
    # shared-memory read pending, so the membar pass puts none before every iteration's refill.
    barrier()
    for i in range(n_own):
        ahead = i + STAGES - 1
        if ahead < n_own:
            _request_pool(PART + NP * ahead, ahead % STAGES, tok, hi, n_window, d0, win_ptr, cmp_ptr, idx_ptr,
                          stride_it, stride_pool, scale_word, codes_s, tail_s, scales_s, TAIL, PK_TAIL_OFF)
            _request_p(PART + NP * ahead, ahead % STAGES, tok, h0, H, p_ptr, m_ptr, stride_pt, stride_ph, stride_mt,
                       stride_mj, p_s, m_s)
        commit_group()  # (an empty group past the last tile keeps the count)
        barrier()  # every thread's proxy fence (below) of the landed tiles before the wgmma reads them
        stage = i % STAGES
        part = warpgroup_mma(a, p_s.index(stage).permute((1, 0)), zero, use_acc=False, is_async=True)
        f = gl.exp2(m_s.index(stage).load(gl.SliceLayout(0, mma)) - m)
        if i + 1 < n_own:
            a_next = _tile_operand((i + 1) % STAGES, codes_s, tail_s, scales_s, shift, lk, a_op, TAIL)
        else:
            a_next = a
        part, a = warpgroup_mma_wait(num_outstanding=0, deps=(part, a))
        acc = acc + part * f[None, :]
        a = a_next
        wait_group(STAGES - 3)  # own tile i + 2 has landed (this thread's copies) ...
        barrier()  # ... every thread's (of this partition); tile i's stage and tile i + 1's reads done
        fence_async_shared()  # ... and ordered before wgmma's async-proxy reads (behind the next barrier)
    return acc


@gluon.jit
def _program(PART: gl.constexpr, NP: gl.constexpr, ptrs, sizes, strides, ring, exchange,
             HAS_COUNTS: gl.constexpr, BLOCK_J: gl.constexpr, PK_NQ: gl.constexpr, PK_BLOCK: gl.constexpr,
             PK_TAIL_OFF: gl.constexpr, PK_SCALE_OFF: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr):
    """One warpgroup's share of a program: tiles PART, PART + NP, ... of the token. Partition 0 writes
    the output (with NP = 2, after adding partition 1's sum from `exchange`: (buffer, mbarrier))."""
    gl.static_assert(STAGES >= 3, "the ring refills tile i - 1's stage while tile i + 1 converts: 3 stages at least")
    win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, p_ptr, m_ptr, l_ptr, out_ptr = ptrs
    H, C, n_window = sizes
    stride_pool, stride_it, stride_pt, stride_ph, stride_mt, stride_mj, stride_ot, stride_oh = strides
    codes_s, tail_s, scales_s, p_s, m_s = ring
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, HEADS, 16])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    lk: gl.constexpr = gl.DistributedLinearLayout(  # [64 columns, 64 dims]: the A fragment (module docstring)
        reg_bases=[[0, 1], [1, 0], [8, 0], [16, 0], [32, 0]],
        lane_bases=[[2, 0], [4, 0], [0, 2], [0, 4], [0, 8]],
        warp_bases=[[0, 16], [0, 32]], block_bases=[], shape=[BLOCK_T, DIMS])
    stats: gl.constexpr = gl.BlockedLayout([1, 4], [2, 16], [4, 1], [1, 0])  # [BLOCK_J tiles, 64]
    tok = gl.program_id(0).to(gl.int64)
    d0 = gl.program_id(1) * DIMS
    h0 = gl.program_id(2) * HEADS
    hi = C
    if HAS_COUNTS:
        hi = gl.minimum(hi, n_window + gl.maximum(gl.load(counts_ptr + tok), 0))
    # Tiles up to the last live column (this read also brings the idx row into L1 for the loop's requests).
    tiles = gl.arange(0, BLOCK_J, layout=gl.SliceLayout(1, stats))
    lanes = gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, stats))
    cols = tiles[:, None] * BLOCK_T + lanes[None, :]
    rows = gl.load(idx_ptr + stride_it * tok + cols, mask=cols < hi, other=-1)
    n_live = (gl.max(gl.max(gl.where(rows >= 0, cols + 1, 0), axis=1), axis=0) + BLOCK_T - 1) // BLOCK_T
    n_own = gl.maximum(n_live - PART + NP - 1, 0) // NP
    group = d0 // PK_BLOCK  # the programs' dims lie in one scale block (PK_BLOCK == DIMS)
    scale_word = PK_SCALE_OFF + 4 * (group // 4)
    shift = 8 * (group % 4)
    tail = d0 >= PK_NQ  # this program's dims are the bf16 tail
    # The first STAGES - 1 own tiles' pool bytes before the wait (the scores pass writes none of them) ...
    for s in gl.static_range(STAGES - 1):
        if s < n_own:
            if tail:
                _request_pool(PART + NP * s, s, tok, hi, n_window, d0, win_ptr, cmp_ptr, idx_ptr, stride_it,
                              stride_pool, scale_word, codes_s, tail_s, scales_s, True, PK_TAIL_OFF)
            else:
                _request_pool(PART + NP * s, s, tok, hi, n_window, d0, win_ptr, cmp_ptr, idx_ptr, stride_it,
                              stride_pool, scale_word, codes_s, tail_s, scales_s, False, PK_TAIL_OFF)
    heads_s = h0 + gl.arange(0, HEADS, layout=gl.SliceLayout(0, stats))
    sink2 = gl.load(sink_ptr + heads_s, mask=heads_s < H, other=0.0) * 1.4426950408889634
    if PDL:
        gdc_wait()  # the scores pass's p, m and l are complete and visible past this point
    # ... their p and m_j after it: group s = own tile s's (group 0 also every pool copy above)
    for s in gl.static_range(STAGES - 1):
        if s < n_own:
            _request_p(PART + NP * s, s, tok, h0, H, p_ptr, m_ptr, stride_pt, stride_ph, stride_mt, stride_mj, p_s,
                       m_s)
        commit_group()
    # The softmax's max and denominator over the live tiles' m_j, l_j and the sink.
    ok = (tiles < n_live)[:, None] & (heads_s < H)[None, :]
    ml = stride_mt * tok + tiles[:, None] * stride_mj + heads_s[None, :]
    m_tiles = gl.load(m_ptr + ml, mask=ok, other=float("-inf"))
    m = gl.maximum(sink2, gl.max(m_tiles, axis=0))
    if PART == 0:
        l_tiles = gl.load(l_ptr + ml, mask=ok, other=0.0)
        denom = gl.sum(l_tiles * gl.exp2(m_tiles - m[None, :]), axis=0) + gl.exp2(sink2 - m)
    m = gl.convert_layout(m, gl.SliceLayout(0, mma))
    wait_group(STAGES - 3)  # own tiles 0 and 1 have landed: every thread's (the barrier), and ordered
    barrier()  # before wgmma's async-proxy reads (the fence; the loop's barrier comes before the wgmma)
    fence_async_shared()
    loop_ptrs = (win_ptr, cmp_ptr, idx_ptr, p_ptr, m_ptr)
    loop_strides = (stride_it, stride_pool, stride_pt, stride_ph, stride_mt, stride_mj)
    if tail:
        acc = _values_loop(PART, NP, n_own, m, tok, hi, d0, h0, loop_ptrs, (H, n_window), loop_strides, scale_word,
                           shift, ring, lk, a_op, mma, True, PK_TAIL_OFF, STAGES)
    else:
        acc = _values_loop(PART, NP, n_own, m, tok, hi, d0, h0, loop_ptrs, (H, n_window), loop_strides, scale_word,
                           shift, ring, lk, a_op, mma, False, PK_TAIL_OFF, STAGES)
    if NP > 1:
        partial, done = exchange
        if PART == 1:  # hand the sum over to partition 0
            partial.store(acc)
            barrier()  # every warp's share stored before the arrival
            mbarrier.arrive(done)
        else:
            mbarrier.wait(done, 0)
            acc = acc + partial.load(mma)
    if PART == 0:
        out = acc / gl.convert_layout(denom, gl.SliceLayout(0, mma))[None, :]
        r = gl.arange(0, DIMS, layout=gl.SliceLayout(1, mma))
        dims = d0 + 16 * (r // 16) + 2 * (r % 8) + (r // 8) % 2
        heads = h0 + gl.arange(0, HEADS, layout=gl.SliceLayout(0, mma))
        gl.store(out_ptr + stride_ot * tok + heads[None, :] * stride_oh + dims[:, None],
                 out.to(out_ptr.dtype.element_ty), mask=(heads < H)[None, :])


@gluon.jit
def _ring(STAGES: gl.constexpr):
    """One warpgroup's ring of STAGES stages: codes [64, 64] bytes (16-byte chunks swizzled by (row // 2)
    % 4), tail [64, 64] bf16 (chunks swizzled by row % 8), scale words [64], p [64 heads, 64 columns]
    (wgmma's 128-byte swizzle), m_j [64]."""
    flat: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])  # (a ring of 1-d rows)
    codes_s = gl.allocate_shared_memory(gl.uint8, [STAGES, BLOCK_T, DIMS], gl.SwizzledSharedLayout(16, 2, 4, [1, 0]))
    tail_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BLOCK_T, DIMS], gl.SwizzledSharedLayout(8, 1, 8, [1, 0]))
    scales_s = gl.allocate_shared_memory(gl.int32, [STAGES, BLOCK_T], flat)
    p_s = gl.allocate_shared_memory(gl.bfloat16, [STAGES, HEADS, BLOCK_T],
                                    gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2))
    m_s = gl.allocate_shared_memory(gl.float32, [STAGES, HEADS], flat)
    return codes_s, tail_s, scales_s, p_s, m_s


@gluon.jit
def _values_packed_gluon_kernel(
    win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, p_ptr, m_ptr, l_ptr, out_ptr,
    H, C, n_window,
    stride_pool, stride_it, stride_pt, stride_ph, stride_mt, stride_mj, stride_ot, stride_oh,
    HAS_COUNTS: gl.constexpr, BLOCK_J: gl.constexpr, PK_NQ: gl.constexpr, PK_BLOCK: gl.constexpr,
    PK_TAIL_OFF: gl.constexpr, PK_SCALE_OFF: gl.constexpr, STAGES: gl.constexpr = 4, PDL: gl.constexpr = False,
    WARPGROUPS: gl.constexpr = 1,
):
    """Grid (T, D / 64, cdiv(H, 64)); strides in elements (bytes for the pools). BLOCK_J: a power of two
    >= the launch's tiles (the stats block). WARPGROUPS 2: the token's tiles alternate between two
    warpgroups (warp-specialised partitions, a ring each), partition 1's sum handed to partition 0
    through shared memory: each chain half as long."""
    ptrs = (win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, p_ptr, m_ptr, l_ptr, out_ptr)
    sizes = (H, C, n_window)
    strides = (stride_pool, stride_it, stride_pt, stride_ph, stride_mt, stride_mj, stride_ot, stride_oh)
    if WARPGROUPS == 1:
        _program(0, 1, ptrs, sizes, strides, _ring(STAGES), None, HAS_COUNTS, BLOCK_J, PK_NQ, PK_BLOCK, PK_TAIL_OFF,
                 PK_SCALE_OFF, STAGES, PDL)
    else:
        partial = gl.allocate_shared_memory(gl.float32, [DIMS, HEADS], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
        done = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(done, count=1)
        ring0 = _ring(STAGES)
        ring1 = _ring(STAGES)
        # NOTE: constexprs go into the partitions' argument tuples directly (a tuple assigned to a name
        # first turns its constexprs into tensors).
        gl.warp_specialize([
            (_program, (0, 2, ptrs, sizes, strides, ring0, (partial, done), HAS_COUNTS, BLOCK_J, PK_NQ, PK_BLOCK,
                        PK_TAIL_OFF, PK_SCALE_OFF, STAGES, PDL)),
            (_program, (1, 2, ptrs, sizes, strides, ring1, (partial, done), HAS_COUNTS, BLOCK_J, PK_NQ, PK_BLOCK,
                        PK_TAIL_OFF, PK_SCALE_OFF, STAGES, PDL)),
        ], [4], [WORKER_REGS])


def values_gluon_applies(out: torch.Tensor, pk: dict, block_t: int, n_tiles: int, pools) -> bool:
    """This kernel serves the launch: the two-pass Gluon kernels' rule (packed_rows_gluon.v4_rows_apply)
    and at most MAX_TILES tiles."""
    return n_tiles <= MAX_TILES and v4_rows_apply(out.device, pk, out.shape[-1], block_t, pools)


def two_pass_values_gluon(win, cmp, it, ct, sink, p, m, l, out, n_window, has_counts, pdl, pk, warpgroups=1):
    """The values pass (sparse_attn_two_pass.two_pass_values' arguments, packed pools) by this kernel;
    the caller checks `values_gluon_applies`. warpgroups: the kernel's WARPGROUPS (1 or 2). Writes and
    returns out [T, H, D]."""
    if warpgroups not in (1, 2):
        raise ValueError(f"warpgroups must be 1 or 2, got {warpgroups}")
    T, H, D = out.shape
    n_tiles = m.shape[1]
    _values_packed_gluon_kernel[(T, D // DIMS.value, triton.cdiv(H, HEADS.value))](
        win, cmp, it, ct, sink, p, m, l, out, H, it.shape[1], n_window,
        win.stride(-2), it.stride(0), p.stride(0), p.stride(1), m.stride(0), m.stride(1), out.stride(0),
        out.stride(1),
        HAS_COUNTS=has_counts, BLOCK_J=triton.next_power_of_2(n_tiles), PK_NQ=pk["PK_NQ"], PK_BLOCK=pk["PK_BLOCK"],
        PK_TAIL_OFF=pk["PK_TAIL_OFF"], PK_SCALE_OFF=pk["PK_SCALE_OFF"], STAGES=STAGES, WARPGROUPS=warpgroups,
        num_warps=4, **(dict(maxnreg=MAX_REGS) if warpgroups == 2 else {}),
        **(dict(PDL=True, launch_pdl=True) if pdl else {}),
    )
    return out
