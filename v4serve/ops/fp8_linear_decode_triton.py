"""Decode FP8 block-scaled linear whose weight bytes are requested before the previous kernel ends.

At decode (M <= 16 rows) the small projections move 1-8 MB of weights, a microsecond of HBM time,
but a chain of dependent launches (activation quantization, the split-K matmul, the split-K sum)
each waiting for its predecessor's bytes spends ~2 µs a link. This kernel shortens the chain:

  1. Weights first. A program owns one N tile (BLOCK_N weight rows) and STEPS consecutive K steps
     of BLOCK_K; it loads all of its weight bytes [STEPS, BLOCK_K, BLOCK_N] and their scales into
     registers *before* `gdc_wait` (programmatic dependent launch: the weights do not depend on the
     previous kernel), so their HBM latency overlaps the previous kernel's tail (or, after an
     `act_quant` launched with an early trigger, its whole run).
  2. Then the activations: QUANT_A reads x itself and quantizes its [STEPS, ROWS, BLOCK_K] tile
     (ROWS = M rounded up to a power of two: quantizing the MMA's 16 padded rows cost ~1,500
     instructions a thread at 4 steps, sm_90 SASS) with the official math
     (`fp8_act_quant_triton.quantize_groups`: the act_quant launch's bytes; needs BLOCK_K == the
     activation group), then repeats those rows to fill the MMA tile; otherwise it reads the
     codes and scales act_quant wrote.
  3. One FP8 MMA per K step, batched over the steps (a 3-D dot), the block scales applied to each
     step's fp32 partial as the reference fp8_gemm promotes them, the steps summed in fp32.
  4. The split-K partials: one split writes y; several write fp32 partials [SPLITS, M, N] that
     the in-order sum kernel below adds in a second launch (the tile kernels use it too), or,
     with SUM_LAST, the last program of each N tile to arrive (an atomic counter per tile in a
     caller-kept int32 buffer, left at zero) adds them in split order: the same bits as the sum
     kernel, one launch less (`store_split`, shared with the tile kernel of fp8_linear_triton.py). (Session 10 measured a last-arriving sum ~1 µs slower than the sum
     kernel, but its benchmark made fresh zeroed counters on every call: a memset launch inside
     the timed graph. `fp8_linear(..., arrivals=)` takes counters the caller keeps; the
     `fp8 decode` sweep times it that way.)
     With SWIGLU (a stacked gate | up weight [2I, K], I a multiple of BLOCK_N: the shared expert's
     w1 and w3 as one FP8Linear), the ticket counts the arrivals of both tiles of a pair (gate
     columns [n0, n0 + BLOCK_N), up columns [I + n0, I + n0 + BLOCK_N): 2 * SPLITS programs) and
     the last one sums each tile's partials in split order, rounds gate and up to the output dtype
     (the bits the unfused linears store) and writes the clamped SwiGLU h [M, I] of those columns
     (`store_split_swiglu`): the bits of w1, w3 and the SwiGLU kernel, one launch instead of three.

Weight-only numerics (ACT_FP8 False; W8A16, the models' default): step 2 reads x (bf16 / fp16) after
the wait as it is, the codes are widened to x's dtype (exact) for a bf16 / fp16 MMA, and each step's
partial is scaled by s_w alone: y[m, n] = sum_s sum_{k in step s} x[m, k] w[n, k] * s_w[n // BN, k0_s // BK].
The steps of a program are summed by Triton's tree reduction, or with IN_ORDER one after the other
from zero, as the tile kernel's loop adds them: with the same splits (Flash wq_a, wkv, shared w1 /
w2 on 132 SMs), the same MMA (mma.sync m16n8k16 in both on sm_90, Triton 3.6) and power-of-two
block scales (ue8m0 checkpoints: the scaling is exact, so the tile loop's fused multiply-add adds
the same value) that gives the tile kernel's bits; the tree order differs from it by fp32 roundings only (at most 4 terms: well
under one bf16 ulp after the final rounding, which it can flip on a tie).

Math: y[m, n] = sum_s sum_{k in step s} q[m, k] w[n, k] * s_a[m, s] * s_w[n // BN, k0_s // BK],
with q the e4m3 activation codes, s_a their ue8m0 scales, w the e4m3 weight codes and s_w the fp32
block scales (fp8_linear_reference.py); products exact, sums fp32 (the tensor cores' sum inside one
step, then the steps, then the splits in order). Deterministic: no fp32 atomics.

Layouts: x [M, K] bf16 read as int32 words (QUANT_A: K and the row stride even), or e4m3 codes
[M, K] + fp32 scales [M, ceil(K / AB)], or (weight-only) bf16 / fp16 [M, K]; weight e4m3 [N, K] row-major, read as 16-byte vectors
along K; scale fp32 [ceil(N / BN), ceil(K / BK)]; partials fp32 [SPLITS, M, N] contiguous; y [M, N].
Needs FP8 loads and dots (sm_89+; sm_80 takes the tile kernels of fp8_linear_triton.py).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from v4serve.ops.fp8_act_quant_triton import act_quant_triton, quantize_groups
from v4serve.ops.swiglu_triton import clamped_swiglu_f32

# 16 rows (every decode M up to 16 in one pass over the weights), 64 weight rows (one N tile
# inside one 128-row scale block), 128-channel steps; at most MAX_STEPS steps a program, all held
# in registers (4 steps: 32 KB of weights, 64 registers a thread at 4 warps); SUM_BLOCK outputs a
# program of the split-K sum kernel.
# MAX_N: measured on the H200 (session 12, production rows beside the tile kernels' of the same
# session): the weights-first kernel won at N = 512 (wkv M1 / M8 6.15 / 6.72 against 8.06 / 8.65 µs)
# and lost 0.5-1.1 µs at N = 1024-4096 (wq_a M1 7.31 vs 6.77, shared w2 M1 6.97 vs 6.32, M8 7.89 vs
# 6.75), so production takes it up to N = 512 only (the sweep `kernel_configs 'fp8 decode'` is unrun).
FP8_AHEAD_CONFIG = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, MAX_STEPS=4, MAX_N=512, QUANT_A=True, SUM_LAST=False,
                        SUM_BLOCK=1024, IN_ORDER=False, num_warps=4, num_stages=1)
SPLIT_K_SUM_BLOCK = 1024


@triton.jit
def store_split(acc, part_ptr, y_ptr, arrivals_ptr, tile, split, offs_m, offs_n, M, N, stride_y,
                SPLITS: tl.constexpr, SUM_LAST: tl.constexpr):
    """The end of a split-K program (this kernel's and the tile kernel's of fp8_linear_triton.py):
    one split writes y; otherwise the fp32 partial [BLOCK_M, BLOCK_N] goes to part[split] (contiguous
    [SPLITS, M, N], row stride stride_y), and with SUM_LAST the last program of the N tile `tile` to
    arrive (int32 ticket per tile, atomic acq_rel) adds the SPLITS partials in split order (the sum
    kernel's bits), writes y and sets the ticket back to zero for the next launch."""
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    out = offs_m[:, None] * stride_y + offs_n[None, :]
    if SPLITS == 1:
        tl.store(y_ptr + out, acc.to(y_ptr.dtype.element_ty), mask=mask)
    else:
        stride_split = M * stride_y
        tl.store(part_ptr + split * stride_split + out, acc, mask=mask)
        if SUM_LAST:
            tl.debug_barrier()  # every thread's partial is stored before the (release) arrival
            arrived = tl.atomic_add(arrivals_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLITS - 1:
                total = tl.zeros(acc.shape, dtype=tl.float32)
                for s in tl.static_range(SPLITS):  # in split order: the sum kernel's bits
                    total += tl.load(part_ptr + s * stride_split + out, mask=mask, other=0.0, cache_modifier=".cg")
                tl.store(y_ptr + out, total.to(y_ptr.dtype.element_ty), mask=mask)
                tl.store(arrivals_ptr + tile, 0)  # zero again for the next launch (a graph replay too)


@triton.jit
def store_split_swiglu(acc, part_ptr, h_ptr, arrivals_ptr, tile, split, offs_m, offs_n, M, N, limit,
                       SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """`store_split` for a stacked gate | up weight (N = 2I outputs, I a multiple of BLOCK_N): the
    fp32 partial goes to part[split] (contiguous [SPLITS, M, N]); the ticket of the pair (tile
    `tile` mod I / BLOCK_N) counts the 2 * SPLITS programs of its gate tile and its up tile, and
    the last to arrive adds each tile's partials in split order (the sum kernel's bits), rounds
    them to h's dtype (what the unfused linears store) and writes the clamped SwiGLU of the pair's
    BLOCK_N columns of h [M, I] (the SwiGLU kernel's math), then zeroes the ticket."""
    half = N // 2
    stride_split = M * N
    out = offs_m[:, None] * N + offs_n[None, :]
    tl.store(part_ptr + split * stride_split + out, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))
    tl.debug_barrier()  # every thread's partial is stored before the (release) arrival
    pair = tile % (half // BLOCK_N)
    arrived = tl.atomic_add(arrivals_ptr + pair, 1, sem="acq_rel", scope="gpu")
    if arrived == 2 * SPLITS - 1:
        cols = pair * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (offs_m[:, None] < M) & (cols[None, :] < half)
        gate_out = offs_m[:, None] * N + cols[None, :]
        gate = tl.zeros(acc.shape, dtype=tl.float32)
        up = tl.zeros(acc.shape, dtype=tl.float32)
        for s in tl.static_range(SPLITS):  # in split order: the sum kernel's bits
            gate += tl.load(part_ptr + s * stride_split + gate_out, mask=mask, other=0.0, cache_modifier=".cg")
            up += tl.load(part_ptr + s * stride_split + half + gate_out, mask=mask, other=0.0, cache_modifier=".cg")
        dtype = h_ptr.dtype.element_ty
        h = clamped_swiglu_f32(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), limit, dtype)
        tl.store(h_ptr + offs_m[:, None] * half + cols[None, :], h, mask=mask)
        tl.store(arrivals_ptr + pair, 0)  # zero again for the next launch (a graph replay too)


@triton.jit
def _fp8_linear_decode_ahead_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, part_ptr, y_ptr, arrivals_ptr, M, N, K,
    stride_x, stride_xs, stride_w, stride_ws, stride_y,
    BN: tl.constexpr, BK: tl.constexpr, AB: tl.constexpr, QUANT_A: tl.constexpr, SUM_LAST: tl.constexpr,
    STEPS: tl.constexpr, SPLITS: tl.constexpr, ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PDL: tl.constexpr = False, ACT_FP8: tl.constexpr = True, IN_ORDER: tl.constexpr = False,
    limit=0.0, SWIGLU: tl.constexpr = False,
):
    """Program (n tile, split): K steps [split * STEPS, (split + 1) * STEPS) of every row of x
    against BLOCK_N weight rows (see the module docstring). ACT_FP8 False: the weight-only numerics
    (x bf16 / fp16 as is, the codes widened to x's dtype). IN_ORDER: the steps' scaled partials
    added one after the other from zero (the tile kernel's order) instead of Triton's tree sum.
    SWIGLU: a stacked gate | up weight, y_ptr is h [M, N / 2] (`store_split_swiglu`)."""
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_s = tl.arange(0, STEPS)
    offs_k = tl.arange(0, BLOCK_K)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    k0 = (split * STEPS + offs_s) * BLOCK_K  # [STEPS]: each step's first channel
    kw = k0[:, None, None] + offs_k[None, :, None]  # [STEPS, BLOCK_K, 1]
    w = tl.load(w_ptr + offs_n.to(tl.int64)[None, None, :] * stride_w + kw,
                mask=(kw < K) & mask_n[None, None, :], other=0.0)  # [STEPS, BLOCK_K, BLOCK_N]
    s_w = tl.load(ws_ptr + (offs_n // BN)[None, :] * stride_ws + (k0 // BK)[:, None],
                  mask=(k0 < K)[:, None] & mask_n[None, :], other=0.0)  # [STEPS, BLOCK_N]
    if PDL:
        gdc_wait()  # the previous kernel's outputs (x, or its codes and scales) are visible from here
        gdc_launch_dependents()
    if not ACT_FP8:  # weight-only: x as is, the e4m3 codes exact in x's dtype
        ka = k0[:, None, None] + offs_k[None, None, :]  # [STEPS, 1, BLOCK_K]
        a = tl.load(x_ptr + offs_m.to(tl.int64)[None, :, None] * stride_x + ka,
                    mask=(offs_m[None, :, None] < M) & (ka < K), other=0.0)
        scaled = tl.dot(a, w.to(tl.float32).to(a.dtype)) * s_w[:, None, :]
    else:
        if QUANT_A:  # BLOCK_K == AB: one activation group a step; only the first ROWS rows quantized
            offs_r = tl.arange(0, ROWS)
            kx = (k0 // 2)[:, None, None] + tl.arange(0, BLOCK_K // 2)[None, None, :]  # bf16 pairs as int32 words
            words = tl.load(x_ptr + offs_r.to(tl.int64)[None, :, None] * stride_x + kx,
                            mask=(offs_r[None, :, None] < M) & (kx < K // 2), other=0)  # [STEPS, ROWS, BLOCK_K / 2]
            lo = (words << 16).to(tl.float32, bitcast=True)  # channel 2j (little-endian: the low half)
            hi = (words & -65536).to(tl.float32, bitcast=True)  # channel 2j + 1
            byte, s_r = quantize_groups(tl.reshape(tl.join(lo, hi), (STEPS * ROWS, BLOCK_K)))
            # rows r, r + ROWS, r + 2 ROWS, ... of the MMA tile repeat row r (only rows < M are stored)
            a = tl.broadcast_to(tl.reshape(byte, (STEPS, 1, ROWS, BLOCK_K)), (STEPS, BLOCK_M // ROWS, ROWS, BLOCK_K))
            a = tl.reshape(a, (STEPS, BLOCK_M, BLOCK_K)).to(tl.float8e4nv, bitcast=True)
            s_a = tl.broadcast_to(tl.reshape(s_r, (STEPS, 1, ROWS)), (STEPS, BLOCK_M // ROWS, ROWS))
            s_a = tl.reshape(s_a, (STEPS, BLOCK_M))
        else:
            ka = k0[:, None, None] + offs_k[None, None, :]  # [STEPS, 1, BLOCK_K]
            a = tl.load(x_ptr + offs_m.to(tl.int64)[None, :, None] * stride_x + ka,
                        mask=(offs_m[None, :, None] < M) & (ka < K), other=0.0)
            s_a = tl.load(xs_ptr + offs_m.to(tl.int64)[None, :] * stride_xs + (k0 // AB)[:, None],
                          mask=(offs_m[None, :] < M) & (k0 < K)[:, None], other=0.0)  # [STEPS, BLOCK_M]
        part = tl.dot(a, w)  # [STEPS, BLOCK_M, BLOCK_N]: the raw code products of each step
        scaled = part * s_a[:, :, None] * s_w[:, None, :]
    if IN_ORDER:  # ((0 + p_0) + p_1) + ...: picking step s out by a masked sum adds only zeros (exact)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(STEPS):
            acc += tl.sum(tl.where(offs_s[:, None, None] == s, scaled, 0.0), axis=0)
    else:
        acc = tl.sum(scaled, axis=0)
    if SWIGLU:
        store_split_swiglu(acc, part_ptr, y_ptr, arrivals_ptr, pid_n, split, offs_m, offs_n, M, N, limit,
                           SPLITS, BLOCK_N)
    else:
        store_split(acc, part_ptr, y_ptr, arrivals_ptr, pid_n, split, offs_m, offs_n, M, N, stride_y, SPLITS,
                    SUM_LAST)


@triton.jit
def _split_k_sum_kernel(part_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False,
                        TRIGGER: tl.constexpr = False):
    """y[i] = sum over s in order of part[s, i] (fp32), rounded once. TRIGGER (with PDL): the next
    kernel may launch once every program has passed the wait (a decode linear then loads its
    weights while this one sums)."""
    if PDL:
        gdc_wait()
        if TRIGGER:
            gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


def split_k_sum(part: torch.Tensor, y: torch.Tensor, pdl: dict, trigger: bool = False,
                block: int = SPLIT_K_SUM_BLOCK) -> None:
    """y [M, N] = the in-order sum of the contiguous fp32 partials [SPLITS, M, N], rounded once;
    `block` outputs a program (4 a thread up to 1024: 16-byte loads)."""
    mn = y.numel()
    _split_k_sum_kernel[(triton.cdiv(mn, block),)](
        part, y, mn, SPLIT_K=part.shape[0], BLOCK=block, num_warps=max(1, min(4, block // 128)),
        **pdl, **(dict(TRIGGER=True) if trigger and pdl else {}))


def ahead_steps(k: int, block_k: int, n_tiles: int, programs_wanted: int, split_k: int | None) -> tuple[int, int]:
    """(splits, steps a program): the K steps split over enough programs to fill `programs_wanted`
    (or over `split_k` splits), each split a power-of-two number of steps (the last one masked)."""
    k_steps = triton.cdiv(k, block_k)
    splits = split_k or max(1, min(k_steps, triton.cdiv(programs_wanted, n_tiles)))
    steps = triton.next_power_of_2(triton.cdiv(k_steps, splits))
    return triton.cdiv(k_steps, steps), steps


def fp8_linear_decode_ahead(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                            act_block: int | None, cfg: dict, splits: int, steps: int, pdl: dict,
                            arrivals: torch.Tensor | None = None, swiglu_limit: float | None = None) -> torch.Tensor:
    """y [M, N] for x [M, K] (M <= cfg BLOCK_M) through `_fp8_linear_decode_ahead_kernel`; the
    caller (fp8_linear_triton) has chosen cfg, splits and steps. act_block None: the weight-only
    numerics (x bf16 / fp16). `arrivals`: int32 zeros [>= N tiles] the caller keeps (SUM_LAST;
    fresh zeros otherwise, one memset launch). `swiglu_limit`: weight is a stacked gate | up
    [2I, K] (I a multiple of BLOCK_N) and the result h [M, I] their clamped SwiGLU, summed in the
    last program of each pair of tiles (`store_split_swiglu`, whatever SUM_LAST says)."""
    m, k = x.shape
    n = weight.shape[0]
    n_tiles = triton.cdiv(n, cfg["BLOCK_N"])
    act_fp8 = act_block is not None
    if act_fp8 and cfg["QUANT_A"]:
        if cfg["BLOCK_K"] != act_block:
            raise ValueError(f"QUANT_A needs BLOCK_K == act_block, got {cfg['BLOCK_K']} and {act_block}")
        if x.dtype != torch.bfloat16 or k % 2 or x.stride(0) % 2 or x.data_ptr() % 4:
            raise ValueError("QUANT_A reads x as int32 words: bf16 with an even K and row stride, 4-byte aligned")
        a, a_scale = x.view(torch.int32), x  # stride_x in words; (a_scale is not read)
    elif act_fp8:
        a, a_scale = act_quant_triton(x, act_block, pdl)
    elif x.dtype in (torch.bfloat16, torch.float16):
        a, a_scale = x, x  # (a_scale is not read)
    else:
        raise ValueError(f"the weight-only decode kernel takes bf16 or fp16 x, got {x.dtype}")
    swiglu = swiglu_limit is not None
    if swiglu and (n % (2 * cfg["BLOCK_N"])):
        raise ValueError(f"the fused SwiGLU needs N = 2I with I a multiple of {cfg['BLOCK_N']}, got N = {n}")
    y = torch.empty(m, n // 2 if swiglu else n, dtype=x.dtype, device=x.device)
    sum_last = cfg["SUM_LAST"] and splits > 1
    part = torch.empty(splits, m, n, dtype=torch.float32, device=x.device) if splits > 1 or swiglu else y
    arrivals = split_counters(arrivals, n_tiles, x.device) if sum_last or swiglu else y
    _fp8_linear_decode_ahead_kernel[(n_tiles, splits)](
        a, a_scale, weight, scale, part, y, arrivals, m, n, k,
        a.stride(0), a_scale.stride(0), weight.stride(0), scale.stride(0), y.stride(0),
        BN=block[0], BK=block[1], AB=act_block or 1, QUANT_A=act_fp8 and cfg["QUANT_A"], SUM_LAST=sum_last,
        STEPS=steps, SPLITS=splits, ROWS=triton.next_power_of_2(m), BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"], ACT_FP8=act_fp8, IN_ORDER=cfg["IN_ORDER"], num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **pdl, **(dict(limit=float(swiglu_limit), SWIGLU=True) if swiglu else {}))
    if splits > 1 and not sum_last and not swiglu:
        split_k_sum(part, y, pdl, trigger=True, block=cfg["SUM_BLOCK"])
    return y


def split_counters(arrivals: torch.Tensor | None, n_tiles: int, device: torch.device) -> torch.Tensor:
    """The SUM_LAST tickets: the caller's (checked: contiguous int32, >= n_tiles, left at zero by
    every launch), or fresh zeros (a memset launch: benchmarks should pass kept ones)."""
    if arrivals is None:
        return torch.zeros(n_tiles, dtype=torch.int32, device=device)
    if arrivals.dtype != torch.int32 or arrivals.numel() < n_tiles or not arrivals.is_contiguous():
        raise ValueError(f"arrivals must be contiguous int32 zeros [>= {n_tiles}], got {arrivals.dtype} "
                         f"[{arrivals.numel()}]")
    return arrivals
