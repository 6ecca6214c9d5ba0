"""The two-pass decode's scores pass over packed fp8 rows, in Gluon (sm_90; issue 17): the contract and
math of sparse_attn_two_pass.py's scores pass (read its docstring first),

    s_c = qk_scale_log2 * q[t, h] . kv_c,     m_j = max(sink2, max_c s_c),
    p[t, h, c] = 2^(s_c - m_j) in bf16,       l_j = sum_c 2^(s_c - m_j) in fp32,

over a 64-column tile of `fp8_e8m0_b64_rope64` rows (DeepSeek-V4's main and window rows at D 512: e4m3
codes of channels 0..447, the bf16 RoPE channels 448..511 at byte 448, the ue8m0 scale of channels
[64 g, 64 g + 64) in byte 576 + g; kv_pack_triton.py), for 64 heads a program.

Why a second scores kernel. The `tl` whole-tile scores pass (WHOLE_TILE, production over packed rows)
gathers the tile, dequantizes all of it, stores it to shared memory and only then runs S = Q K^T: on
the H200 the conversion (~0.4 µs) and the MMA (~0.8 µs over two m64n32 warpgroups that each read all
of Q) run one after the other (docs/performance.md, session 14); Triton 3.6 makes straight-line chained
dots synchronous, so splitting the dot does not overlap them. Here the order is ours:

1. Q [64 heads, 512] is requested by cp.async into shared memory (wgmma's A operand) at once;
2. the tile's bytes are loaded into registers in one round (every row's codes in 16-byte loads, its
   bf16 tail, its two scale words: 18 16-byte loads a thread);
3. for each 64-channel block b (7 code blocks, then the tail): dequantize it (e4m3 -> bf16 exactly,
   times the row's block scale: kv_pack_triton's `_e4m3_scaled_cvt_bf16`), store it to its slice of
   the shared K tile [64 columns, 512] (wgmma's 128-byte swizzle), fence it for the async proxy, pass
   a barrier and issue S += Q[:, b] K[:, b]^T asynchronously (4 k16 steps): block b + 1 converts
   while block b's MMA runs; one wait after the tail's;
4. the softmax epilogue of the `tl` kernel: -inf for columns that are holes, m_j, p (bf16), l_j.

Tiles at or past the token's column bound write nothing (the values pass never reads them). With PDL
it triggers its dependent (the values pass) at once, as the `tl` kernel does.

Numerics: the same dequantized values as the `tl` pass and the same products; S sums the 512
channels in k16 steps of wgmma (fp32) in channel order, as one dot over the whole tile does: within
fp32 summation order of the `tl` kernel (the k16 steps' internal order is the hardware's).
"""

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere.async_copy import commit_group, wait_group
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from v4serve.ops.gluon_builtins import barrier, cp_async, gdc_launch_dependents
from v4serve.ops.packed_rows_gluon import e4m3_scaled_bf16, tile_rows, v4_rows_apply

BLOCK_T = gl.constexpr(64)  # columns a program (wgmma's N)
HEADS = gl.constexpr(64)  # heads a program (wgmma's M)
D = gl.constexpr(512)  # the head dim (DeepSeek-V4's)
BLOCK = gl.constexpr(64)  # channels a scale block (and the bf16 tail's width)


@gluon.jit
def _scores_packed_gluon_kernel(
    q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, p_ptr, m_ptr, l_ptr,
    H, C, n_window, qk_scale_log2,
    stride_qt, stride_qh, stride_pool, stride_it, stride_pt, stride_ph, stride_mt, stride_mj,
    HAS_COUNTS: gl.constexpr, PK_NQ: gl.constexpr, PK_TAIL_OFF: gl.constexpr, PK_SCALE_OFF: gl.constexpr,
    PDL: gl.constexpr = False,
):
    """Grid (T, n_tiles, cdiv(H, 64)); strides in elements (bytes for the pools); D = 512 with PK_NQ =
    448 code channels (7 blocks of 64) and a bf16 tail of 64."""
    NB: gl.constexpr = PK_NQ // BLOCK  # code blocks
    if PDL:
        gdc_launch_dependents()  # the values pass may start its prologue (it waits for this grid)
    tok = gl.program_id(0).to(gl.int64)
    tile = gl.program_id(1)
    h0 = gl.program_id(2) * HEADS
    hi = C
    if HAS_COUNTS:
        hi = gl.minimum(hi, n_window + gl.maximum(gl.load(counts_ptr + tok), 0))
    if tile * BLOCK_T < hi:
        nvmma: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        q_s = gl.allocate_shared_memory(gl.bfloat16, [HEADS, D], nvmma)
        # the K tile a block a buffer ([64 columns, 64] each): separate allocations, so that the store of
        # block b + 1 needs no barrier against block b's MMA, still reading its own buffer
        k_s = ()
        for b in gl.static_range(NB + 1):
            k_s = k_s + (gl.allocate_shared_memory(gl.bfloat16, [BLOCK_T, BLOCK], nvmma), )
        # 1. Q by cp.async, 16 bytes a copy (masked heads zero-filled)
        ql: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
        qh = h0 + gl.arange(0, HEADS, layout=gl.SliceLayout(1, ql))
        qd = gl.arange(0, D, layout=gl.SliceLayout(0, ql))
        cp_async(q_s, q_ptr + stride_qt * tok + qh[:, None] * stride_qh + qd[None, :], mask=(qh < H)[:, None])
        commit_group()
        # 2. the tile's bytes in one round: a thread holds 16 contiguous bytes of two rows a block
        cl: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])  # [64 rows, 64 channels]
        at, live = tile_rows(tile, gl.SliceLayout(1, cl), tok, hi, n_window, win_ptr, cmp_ptr, idx_ptr, stride_it,
                             stride_pool)
        ch = gl.arange(0, BLOCK, layout=gl.SliceLayout(0, cl))
        words_at = (at + PK_SCALE_OFF).to(gl.pointer_type(gl.int32))
        w_lo = gl.load(words_at, mask=live, other=0)  # scale bytes of blocks 0..3
        w_hi = gl.load(words_at + 1, mask=live, other=0)  # blocks 4..
        codes = ()
        for b in gl.static_range(NB):
            codes = codes + (gl.load(at[:, None] + (BLOCK * b + ch)[None, :], mask=live[:, None], other=0), )
        tail = gl.load((at + PK_TAIL_OFF).to(gl.pointer_type(gl.bfloat16))[:, None] + ch[None, :], mask=live[:, None],
                       other=0.0)  # (32 bytes a thread a row: two 16-byte loads)
        sink2 = gl.load(sink_ptr + h0 + gl.arange(0, HEADS, layout=gl.SliceLayout(1, ql)),
                        mask=qh < H, other=0.0) * 1.4426950408889634
        # 3. block by block: dequantize, store, fence, barrier, MMA (async: the next block converts meanwhile)
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                      instr_shape=[16, BLOCK_T, 16])
        s = gl.zeros([HEADS, BLOCK_T], gl.float32, mma)
        for b in gl.static_range(NB + 1):
            if b >= NB:
                vals = tail
            elif b < 4:
                vals = e4m3_scaled_bf16(codes[b], w_lo, 8 * (b % 4))
            else:
                vals = e4m3_scaled_bf16(codes[b], w_hi, 8 * (b % 4))
            k_s[b].store(vals)
            if b == 0:  # this thread's Q copies (here, not earlier: the tile's loads are issued first)
                wait_group(0)
            fence_async_shared()
            barrier()  # (every thread's Q copies and block b visible to the MMA)
            s = warpgroup_mma(q_s.slice(BLOCK * b, BLOCK, dim=1), k_s[b].permute((1, 0)), s, use_acc=b > 0,
                              is_async=True)
        s = warpgroup_mma_wait(num_outstanding=0, deps=(s, ))
        # 4. the softmax's tile statistics and p
        live_c = gl.convert_layout(live, gl.SliceLayout(0, mma))
        heads = h0 + gl.arange(0, HEADS, layout=gl.SliceLayout(1, mma))
        s = gl.where(live_c[None, :], s * qk_scale_log2, float("-inf"))
        m_j = gl.maximum(gl.convert_layout(sink2, gl.SliceLayout(1, mma)), gl.max(s, 1))
        p = gl.exp2(s - m_j[:, None])
        pc = tile * BLOCK_T + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(0, mma))
        gl.store(p_ptr + stride_pt * tok + heads[:, None] * stride_ph + pc[None, :], p.to(p_ptr.dtype.element_ty),
                 mask=(heads < H)[:, None])
        ml = stride_mt * tok + tile * stride_mj + heads
        gl.store(m_ptr + ml, m_j, mask=heads < H)
        gl.store(l_ptr + ml, gl.sum(p, 1), mask=heads < H)


def scores_gluon_applies(qt: torch.Tensor, pk: dict, block_t: int, pools) -> bool:
    """This kernel serves the launch: the two-pass Gluon kernels' rule (packed_rows_gluon.v4_rows_apply)
    at D = 512, with 16-byte aligned q rows whose strides are multiples of 16 elements (Triton takes an
    integer argument as aligned only at % 16: at other strides Q's cp.async cannot prove its 16-byte
    alignment and does not compile)."""
    return (qt.shape[-1] == D.value and qt.stride(-1) == 1 and qt.stride(0) % 16 == 0 and qt.stride(1) % 16 == 0
            and qt.data_ptr() % 16 == 0 and v4_rows_apply(qt.device, pk, qt.shape[-1], block_t, pools))


def two_pass_scores_gluon(qt, win, cmp, it, ct, sink, p, m, l, n_window, qk_scale_log2, has_counts, pdl, pk):
    """The scores pass (sparse_attn_two_pass.two_pass_scores' arguments) by this kernel into the caller's
    p [T, H, n_tiles * 64], m and l [T, n_tiles, H]; the caller checks `scores_gluon_applies`."""
    T, H, _ = qt.shape
    n_tiles = m.shape[1]
    _scores_packed_gluon_kernel[(T, n_tiles, -(-H // HEADS.value))](
        qt, win, cmp, it, ct, sink, p, m, l, H, it.shape[1], n_window, qk_scale_log2,
        qt.stride(0), qt.stride(1), win.stride(-2), it.stride(0), p.stride(0), p.stride(1), m.stride(0), m.stride(1),
        HAS_COUNTS=has_counts, PK_NQ=pk["PK_NQ"], PK_TAIL_OFF=pk["PK_TAIL_OFF"], PK_SCALE_OFF=pk["PK_SCALE_OFF"],
        PDL=pdl, num_warps=4,
    )
