"""Triton tile kernels of the FP8 block-scaled linear, and the dispatch between them and the decode
kernel of fp8_linear_decode_triton.py (activation quantization: fp8_act_quant_triton.py).

Layouts: x [M, K] (bf16 / fp16 / fp32, row stride `stride_x`, unit column stride); weight e4m3
[N, K] row-major (read as uint8 where the GPU has no fp8 conversions); scale float32
[ceil(N/bn), ceil(K/bk)]; activation codes e4m3 [M, K] + scales float32 [M, ceil(K/ab)]; y [M, N].

Math (fp8_linear_reference.py): y = A @ W^T, W = e4m3(weight) * scale per (bn, bk) block, A = x
(weight-only) or the e4m3 / ue8m0 activation quantization Q(x) per ab channels. A program owns a
[BLOCK_M, BLOCK_N] tile of y and walks K in steps of BLOCK_K; per step it reads the weight tile
once and dequantizes it in registers. Two ways of applying the weight scale:
  POST_SCALE (BLOCK_K divides bk, and ab in act mode): the step's partial dot over raw codes is
      scaled in fp32, acc += dot(a, w_codes) * s_w[n] (* s_a[m]): exact for any fp32 scale, and it
      is the reference fp8_gemm's per-block promotion (the tensor cores sum at most BLOCK_K terms).
  pre-scale (bk < BLOCK_K, weight-only): w = (codes * s_w) cast to x.dtype before the dot: exact
      for power-of-two scales (ue8m0 checkpoints, e.g. V4.1's 32x32 blocks).
Operands of the dot: weight-only -> x.dtype (the e4m3 codes are exact in bf16 and fp16);
act mode with FP8_DOT (sm_89+) -> e4m3 x e4m3 (wgmma FP8 on sm_90); act mode without it -> the
codes decoded to bf16 (exact) and a bf16 dot (sm_80). Products are exact, sums fp32: Triton and
the reference differ in the order of the fp32 sums (and, on FP8 tensor cores, in the precision of
the sum inside one BLOCK_K step).

Decode (M <= 16, weight-only M <= W8A16_DECODE_ALWAYS_M = 32, or M <= DECODE_MAX_M = 64 where the
prefill tiles would not fill the GPU) is bandwidth-bound: BLOCK_M (16, 32 or 64) covers every row,
so each weight byte crosses HBM once; the K range is split over SPLIT_K programs per N tile when
N / 64 alone would not fill the GPU (`decode_split_k`: the same split for every M and tile
variant, so a row's bits do not depend on the batch it is computed in), each writing an fp32
partial [SPLIT_K, M, N] that a second kernel sums in split order (deterministic) and rounds, or,
with SUM_LAST and counters the caller keeps (`arrivals`), the last program of the tile to arrive
(`fp8_linear_decode_triton.store_split`: the same order, the same bits, one launch). In act mode
on FP8 GPUs, M <= 16 takes the weights-first decode kernel
(fp8_linear_decode_triton.py: weights requested before the wait on the previous kernel, the
activations quantized in the same launch) wherever a program's K range fits its registers
(`decode_ahead_plan`); the rest (e.g. Flash wq_b / wo_b, 8-13 steps a program) these tiles.
Weight-only (W8A16, the models' default) at M <= 16 follows W8A16_DECODE_RULE: by the K steps a
program holds, the weights-first kernel in weight-only numerics or these tiles, each summing its
splits in the last program where the caller keeps counters; at 17..32 rows (verify batches)
W8A16_ROWS32_RULE (these tiles, BLOCK_M 32).
Prefill uses large tiles and writes y directly.

A stacked gate | up weight [2I, K] with `swiglu_limit` (the shared expert's w1 and w3 as one
FP8Linear, `fp8_linear_swiglu`) returns h = clamped_swiglu(y[:, :I], y[:, I:]) [M, I]: the kernel,
its config and its K split are chosen for an I-row weight (`split_n`: what each member alone
gets), so each output has its member's bits; on the decode kernels the last program of each pair
of gate / up tiles writes h (`fp8_linear_decode_triton.store_split_swiglu`: one launch instead of
w1, w3 and the SwiGLU kernel), elsewhere (prefill, no counters) y then the SwiGLU kernel.
"""

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch, sm_count
from v4serve.ops.fp8_act_quant_triton import act_quant_triton
from v4serve.ops.fp8_linear_decode_triton import (FP8_AHEAD_CONFIG, ahead_steps, fp8_linear_decode_ahead,
                                                  split_counters, split_k_sum, store_split, store_split_swiglu)
from v4serve.ops.quant_decode_triton import e4m3_bits_to_f32
from v4serve.ops.swiglu_triton import clamped_swiglu_triton

__all__ = ["act_quant_triton", "decode_ahead_plan", "decode_programs_wanted", "decode_split_k", "fp8_linear_triton",
           "native_fp8", "w8a16_decode_choice"]

# Decode tiles: BLOCK_M the smallest of 16 / 32 / 64 that holds every row (one pass over the
# weights), the K range split to fill the GPU. Up to 16 rows always; up to DECODE_MAX_M where the
# prefill tiles would leave SMs idle (H200, M64: wq_a ran 27 µs on 8 prefill programs).
DECODE_ALWAYS_M = 16
DECODE_MAX_M = 64
FP8_DECODE_CONFIG = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)
FP8_PREFILL_CONFIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=128, num_warps=8, num_stages=3)
# Weight-only, or no fp8 on the GPU (sm_80): the tiles are decoded in registers, so a shorter K step.
FP8_PREFILL_DEQUANT_CONFIG = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=3)
# sm_80 with act quantization: both operands decoded from bytes.
FP8_PREFILL_SM80_CONFIG = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
# Split-K until the decode grid has at least this many programs per SM.
DECODE_PROGRAMS_PER_SM = 2
# The weight-only (W8A16, the models' default) decode kernel for M <= 16 rows, by the K steps a program
# of the weights-first kernel holds at the split that fills the GPU (FP8_AHEAD_CONFIG's 64-row tiles
# and 128-channel steps; V4-Flash: wkv 1, wq_a 2, shared w1 / w3 / w2 and the indexer's q_b 4, wq_b 8,
# wo_b 16): KERNEL "ahead" (weights-first) or "tiles", plus that kernel's keys. SUM_LAST (the last
# program of a tile sums the split partials: one launch) applies where the caller keeps counters
# (`arrivals`: FP8Linear does), the sum kernel runs otherwise. From the H200 sweep of session 13
# (`python -m v4serve.bench.kernel_configs 'fp8 decode w8a16'`, Triton 3.6, µs): at 1 step the
# weights-first kernel (wkv M1 3.99-4.09 against the tiles' 5.01); at 2 steps the tiles (wq_a M1 4.60
# against 6.97, M8 5.05 against 7.44); beyond, the tiles (shared w1 5.09, w2 4.99, indexer q_b 4.95,
# q_a + kv fused 4.84: weights-first 6.5-6.9).
W8A16_DECODE_RULE = {1: dict(KERNEL="ahead", SUM_LAST=True)}
W8A16_DECODE_OTHERWISE = dict(KERNEL="tiles", SUM_LAST=True)
# Weight-only batches of 17..32 rows (the verify step at c8 k = 3 or c16 k = 1, plain decode at
# c17..c32; issues 18, 21). W8A16_DECODE_ALWAYS_M: weight-only batches up to this many rows take the
# decode tiles whatever the prefill grid. At 16 (before session 14) Flash / Pro wq_b (256 / 512
# prefill programs) took the 128 x 128 prefill tiles at 32 rows: ~33 µs a layer in the c8 k = 3
# verify step (session 13 profile), against 10.8 µs for the decode tiles at one row; every other
# projection already took the decode tiles. At 32 rows the decode tiles hold every row in one
# BLOCK_M = 32 tile (the weights read once, x from L2; one wave of 4 programs a SM: 108 registers,
# 48 KB), with the K split of the 1-16-row path, so a verify row gets the plain step's bits; bound in
# docs/performance.md "Session 14: FP8 W8A16 at 17..32 rows" (at most ~19 µs; 16 puts wq_b back on
# the prefill tiles). W8A16_ROWS32_RULE / _OTHERWISE: the kernel at 17..32 rows by steps a program,
# as W8A16_DECODE_RULE: the tiles with the K split summed by the last program of each tile (no sum
# launch; the 1..16-row path's sum order, so the same bits). H200, 30-layer Flash c8 k = 3 verify step
# (session 23, `bench engine --spec-rows32`, one run): 24.51 / 24.59 ms with a sum launch, 24.40 with
# the last program summing (344 sum launches a step fewer).
W8A16_DECODE_ALWAYS_M = 32
W8A16_ROWS32_MAX_M = 32
W8A16_ROWS32_RULE: dict[int, dict] = {}
W8A16_ROWS32_OTHERWISE = dict(KERNEL="tiles", SUM_LAST=True)


@triton.jit
def _fp8_tile(x_ptr, xs_ptr, w_ptr, ws_ptr, M, N, K, k_begin, k_end, offs_m, offs_n,
              stride_x, stride_xs, stride_w, stride_ws,
              BN: tl.constexpr, BK: tl.constexpr, AB: tl.constexpr, ACT_FP8: tl.constexpr, FP8_DOT: tl.constexpr,
              NATIVE_FP8: tl.constexpr, POST_SCALE: tl.constexpr, IEEE: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """fp32 [BLOCK_M, BLOCK_N]: sum over k in [k_begin, k_end) of A[m, k] * W[n, k]."""
    mask_m = offs_m < M
    mask_n = offs_n < N
    x_rows = x_ptr + offs_m.to(tl.int64)[:, None] * stride_x
    w_cols = w_ptr + offs_n.to(tl.int64)[None, :] * stride_w
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        if NATIVE_FP8 or not ACT_FP8:
            a = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0.0)
        else:
            a = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & mask_k[None, :], other=0)
        if NATIVE_FP8:
            w = tl.load(w_cols + offs_k[:, None], mask=mask_n[None, :] & mask_k[:, None], other=0.0)  # [BK, BN]
        else:
            w = tl.load(w_cols + offs_k[:, None], mask=mask_n[None, :] & mask_k[:, None], other=0)
        if ACT_FP8:
            if not FP8_DOT:
                if NATIVE_FP8:
                    a = a.to(tl.bfloat16)
                    w = w.to(tl.bfloat16)
                else:
                    a = e4m3_bits_to_f32(a.to(tl.int32)).to(tl.bfloat16)
                    w = e4m3_bits_to_f32(w.to(tl.int32)).to(tl.bfloat16)
            part = tl.dot(a, w)
            s_a = tl.load(xs_ptr + offs_m.to(tl.int64) * stride_xs + k0 // AB, mask=mask_m, other=0.0)
            s_w = tl.load(ws_ptr + (offs_n // BN) * stride_ws + k0 // BK, mask=mask_n, other=0.0)
            acc += part * s_a[:, None] * s_w[None, :]
        else:
            if NATIVE_FP8:
                w = w.to(tl.float32)
            else:
                w = e4m3_bits_to_f32(w.to(tl.int32))
            if POST_SCALE:
                s_w = tl.load(ws_ptr + (offs_n // BN) * stride_ws + k0 // BK, mask=mask_n, other=0.0)
            else:
                s_w2 = tl.load(ws_ptr + (offs_n // BN)[None, :] * stride_ws + (offs_k // BK)[:, None],
                               mask=mask_n[None, :] & mask_k[:, None], other=0.0)
                w = w * s_w2
            w = w.to(a.dtype)
            if IEEE:
                part = tl.dot(a, w, input_precision="ieee")
            else:
                part = tl.dot(a, w)
            if POST_SCALE:
                acc += part * s_w[None, :]
            else:
                acc += part
    return acc


@triton.jit
def _fp8_linear_prefill_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, y_ptr, M, N, K, stride_x, stride_xs, stride_w, stride_ws, stride_y,
    BN: tl.constexpr, BK: tl.constexpr, AB: tl.constexpr, ACT_FP8: tl.constexpr, FP8_DOT: tl.constexpr,
    NATIVE_FP8: tl.constexpr, POST_SCALE: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _fp8_tile(x_ptr, xs_ptr, w_ptr, ws_ptr, M, N, K, 0, K, offs_m, offs_n, stride_x, stride_xs, stride_w,
                    stride_ws, BN, BK, AB, ACT_FP8, FP8_DOT, NATIVE_FP8, POST_SCALE, IEEE, BLOCK_M, BLOCK_N, BLOCK_K)
    tl.store(y_ptr + offs_m.to(tl.int64)[:, None] * stride_y + offs_n[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _fp8_linear_decode_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, part_ptr, y_ptr, arrivals_ptr, M, N, K, k_per_split,
    stride_x, stride_xs, stride_w, stride_ws, stride_y,
    BN: tl.constexpr, BK: tl.constexpr, AB: tl.constexpr, ACT_FP8: tl.constexpr, FP8_DOT: tl.constexpr,
    NATIVE_FP8: tl.constexpr, POST_SCALE: tl.constexpr, IEEE: tl.constexpr, SPLITS: tl.constexpr,
    SUM_LAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False, limit=0.0, SWIGLU: tl.constexpr = False,
):
    """Program (n, split): every row of x against BLOCK_N weight rows over one K range
    (k_per_split, a multiple of BLOCK_K); writes y (one split) or its fp32 partial part[split],
    which the last program of the tile sums with SUM_LAST (`store_split`), the sum kernel otherwise.
    SWIGLU: a stacked gate | up weight, y_ptr is h [M, N / 2] (`store_split_swiglu`)."""
    if PDL:
        gdc_wait()
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = _fp8_tile(x_ptr, xs_ptr, w_ptr, ws_ptr, M, N, K, k_begin, k_end, offs_m, offs_n, stride_x, stride_xs,
                    stride_w, stride_ws, BN, BK, AB, ACT_FP8, FP8_DOT, NATIVE_FP8, POST_SCALE, IEEE,
                    BLOCK_M, BLOCK_N, BLOCK_K)
    if SWIGLU:
        store_split_swiglu(acc, part_ptr, y_ptr, arrivals_ptr, tl.program_id(0), split, offs_m, offs_n, M, N,
                           limit, SPLITS, BLOCK_N)
    else:
        store_split(acc, part_ptr, y_ptr, arrivals_ptr, tl.program_id(0), split, offs_m, offs_n, M, N, stride_y,
                    SPLITS, SUM_LAST)


@functools.lru_cache
def _has_fp8(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 9)


def native_fp8(device: torch.device) -> bool:
    """fp8 loads, conversions and dots: sm_89+ (not sm_80), and the interpreter."""
    return not compiled_on_cuda(device) or _has_fp8(device.index if device.index is not None else torch.cuda.current_device())


def _use_decode_tiles(m: int, n: int, device: torch.device, weight_only: bool = False) -> bool:
    always = max(DECODE_ALWAYS_M, W8A16_DECODE_ALWAYS_M) if weight_only else DECODE_ALWAYS_M
    if m <= always or m > DECODE_MAX_M:
        return m <= always
    if not compiled_on_cuda(device):
        return True  # the interpreter: the tiles of the GPUs that take this path
    prefill_programs = triton.cdiv(m, FP8_PREFILL_CONFIG["BLOCK_M"]) * triton.cdiv(n, FP8_PREFILL_CONFIG["BLOCK_N"])
    return prefill_programs < sm_count(device)


def decode_programs_wanted(device: torch.device) -> int:
    """Decode programs that fill the GPU (DECODE_PROGRAMS_PER_SM a SM); 1 in the interpreter."""
    if not compiled_on_cuda(device):
        return 1
    return DECODE_PROGRAMS_PER_SM * sm_count(device)


def decode_split_k(n: int, k_steps: int, device: torch.device) -> int:
    """The decode tiles' K split: from FP8_DECODE_CONFIG's 64-wide N tiles whatever the variant's
    BLOCK_N (and whatever M), so that every tile variant and every row count adds the same K ranges
    in the same order (a 32-row verify batch gives each row the bits of the plain step's run)."""
    n_tiles = triton.cdiv(n, FP8_DECODE_CONFIG["BLOCK_N"])
    return max(1, min(k_steps, triton.cdiv(decode_programs_wanted(device), n_tiles)))


def decode_ahead_plan(m: int, n: int, k: int, block: tuple[int, int], act_block: int | None, fp8_hw: bool,
                      device: torch.device, config: dict | None = None, split_k: int | None = None,
                      x_words: bool = True, x_dtype: torch.dtype = torch.bfloat16,
                      split_n: int | None = None) -> tuple[dict, int, int] | None:
    """(config, splits, steps a program) of the weights-first decode kernel for this shape, or None
    where the tile kernels run it: no FP8 on the GPU, more rows than its BLOCK_M, more outputs than
    MAX_N, more K steps a program (at the split that fills the GPU) than MAX_STEPS, or weight-only
    numerics over x that is neither bf16 nor fp16.
    `config`: FP8_AHEAD_CONFIG's keys to change (tests, benchmarks). The activations are quantized
    in the kernel (QUANT_A) only where a step is one activation group and x can be read as int32
    words (`x_words`: bf16, even K and row stride, 4-byte aligned); act_quant runs first otherwise.
    `split_n`: the outputs that MAX_N and the split are judged by (a stacked gate | up: I), n by default."""
    cfg = dict(FP8_AHEAD_CONFIG, **(config or {}))
    n = split_n or n
    weight_only = act_block is None
    if weight_only and x_dtype not in (torch.bfloat16, torch.float16):
        return None
    if not fp8_hw or m > cfg["BLOCK_M"] or n > cfg["MAX_N"]:
        return None
    cfg["BLOCK_K"] = min(cfg["BLOCK_K"], block[1], act_block or block[1])
    cfg["QUANT_A"] = cfg["QUANT_A"] and not weight_only and cfg["BLOCK_K"] == act_block and x_words
    n_tiles = triton.cdiv(n, cfg["BLOCK_N"])
    splits, steps = ahead_steps(k, cfg["BLOCK_K"], n_tiles, decode_programs_wanted(device), split_k)
    return (cfg, splits, steps) if steps <= cfg["MAX_STEPS"] else None


def w8a16_decode_choice(n: int, k: int, block: tuple[int, int], device: torch.device, m: int = 1) -> dict:
    """Production's W8A16 decode config (KERNEL and its keys) for an [n, k] weight and m rows:
    W8A16_DECODE_RULE (m <= 16) or W8A16_ROWS32_RULE (17..32) at the steps a weights-first program
    would hold (the tile kernel's split is the same one up to 4 steps: wq_a, wkv, shared w1 / w2)."""
    block_k = min(FP8_AHEAD_CONFIG["BLOCK_K"], block[1])
    n_tiles = triton.cdiv(n, FP8_AHEAD_CONFIG["BLOCK_N"])
    steps = ahead_steps(k, block_k, n_tiles, decode_programs_wanted(device), None)[1]
    if m <= FP8_AHEAD_CONFIG["BLOCK_M"]:
        choice = dict(W8A16_DECODE_RULE.get(steps, W8A16_DECODE_OTHERWISE))
    else:
        choice = dict(W8A16_ROWS32_RULE.get(steps, W8A16_ROWS32_OTHERWISE))
    if choice["KERNEL"] == "ahead":  # the rule is the choice: neither MAX_N nor MAX_STEPS applies
        choice.update(MAX_N=n, MAX_STEPS=max(steps, choice.get("MAX_STEPS", 0)))
    return choice


def fp8_linear_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                      act_block: int | None, config: dict | None = None, split_k: int | None = None,
                      fp8_hw: bool | None = None, arrivals: torch.Tensor | None = None,
                      swiglu_limit: float | None = None, split_n: int | None = None) -> torch.Tensor:
    """y [M, N] for x [M, K]. `config` / `split_k` override the tiles and the decode K split (tests,
    benchmarks): a tile config (optionally KERNEL="tiles", SUM_LAST; the keys it names replace
    FP8_DECODE_CONFIG's) runs the decode tiles up to DECODE_MAX_M rows; KERNEL="prefill" the prefill
    tiles at any M; KERNEL="ahead" plus FP8_AHEAD_CONFIG keys to change runs the weights-first decode
    kernel where it applies (`decode_ahead_plan`); None: production's choice (W8A16 at M <= 32:
    `w8a16_decode_choice`). `fp8_hw=False` forces the path of GPUs without fp8 (sm_80: codes decoded
    from bytes). `arrivals`: split counters the caller keeps (int32 zeros [>= N / 64], left at
    zero): the weights-first kernel then sums its partials in the last program (SUM_LAST, unless
    the config says otherwise), and so do the W8A16 tile kernels where the rule says SUM_LAST.
    `swiglu_limit`: weight is a stacked gate | up [2I, K]; returns h [M, I] = the clamped SwiGLU of
    the two halves, each half with the bits it gets alone (see the module docstring). `split_n`:
    the outputs the kernel, tiles and K split are chosen for (n by default)."""
    m, k = x.shape
    n = weight.shape[0]
    bn, bk = block
    if swiglu_limit is not None:
        if n % 2 or (n // 2) % bn:
            raise ValueError(f"a stacked gate | up weight has 2I rows, I a multiple of the block's {bn}, got {n}")
        split_n = n // 2
    split_n = split_n or n
    named = None if config is None else config.get("KERNEL")
    if named == "prefill":  # (sweep, tests: the prefill tiles at any M)
        decode = False
    elif named in ("tiles", "ahead"):  # asked for by name: the decode path up to DECODE_MAX_M rows
        decode = m <= DECODE_MAX_M
    else:
        decode = _use_decode_tiles(m, split_n, x.device, weight_only=act_block is None)
    # the prefill tiles, or no counters for the pair tickets: y (each half its member's bits), then the SwiGLU
    if swiglu_limit is not None and (arrivals is None or not decode):
        y = fp8_linear_triton(x, weight, scale, block, act_block, config, split_k, fp8_hw, split_n=split_n)
        return clamped_swiglu_triton(y[:, :split_n], y[:, split_n:], swiglu_limit)
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight must have a unit stride along K")
    if act_block is not None and (act_block & (act_block - 1) or bk & (bk - 1) or min(act_block, bk) < 16):
        raise ValueError(f"the Triton FP8 path needs power-of-two act_block and block_k >= 16, got "
                         f"act_block={act_block}, block={list(block)}")
    fp8_hw = native_fp8(x.device) if fp8_hw is None else fp8_hw
    if config is None and decode and act_block is None and fp8_hw and m <= W8A16_ROWS32_MAX_M:
        config = w8a16_decode_choice(split_n, k, block, x.device, m)
    kernel = "auto" if config is None else config.get("KERNEL", "tiles")
    config = None if config is None else {key: v for key, v in config.items() if key != "KERNEL"}
    if decode and m and n and kernel in ("auto", "ahead"):
        x_words = x.dtype == torch.bfloat16 and k % 2 == 0 and x.stride(0) % 2 == 0 and x.data_ptr() % 4 == 0
        ahead_cfg = {"SUM_LAST": arrivals is not None, **(config or {})}
        ahead_cfg["SUM_LAST"] = ahead_cfg["SUM_LAST"] and arrivals is not None
        if kernel == "ahead":  # asked for by name (sweep, tests, the W8A16 rule): production's MAX_N does not apply
            ahead_cfg.setdefault("MAX_N", split_n)
        plan = decode_ahead_plan(m, n, k, block, act_block, fp8_hw, x.device, ahead_cfg, split_k, x_words, x.dtype,
                                 split_n)
        if plan is not None:
            return fp8_linear_decode_ahead(x, weight, scale, block, act_block, *plan, pdl_launch(x), arrivals,
                                           swiglu_limit)
    if kernel == "ahead":
        config = None  # (its keys are the weights-first kernel's; the shape takes the tiles)
    sum_last = bool(config and config.pop("SUM_LAST", False)) and arrivals is not None
    if act_block is None:
        prefill_cfg = FP8_PREFILL_DEQUANT_CONFIG
    else:
        prefill_cfg = FP8_PREFILL_CONFIG if fp8_hw else FP8_PREFILL_SM80_CONFIG
    cfg = dict(FP8_DECODE_CONFIG if decode else prefill_cfg, **(config or {}))
    if decode and "BLOCK_M" not in (config or {}):
        cfg["BLOCK_M"] = max(cfg["BLOCK_M"], triton.next_power_of_2(m))
    if act_block is None:
        post = bk % cfg["BLOCK_K"] == 0
        a, a_scale, ab = x, scale, 1  # (a_scale is not read in weight-only mode)
    else:
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], act_block, bk)
        post = True
        ab = act_block
        # (Quantizing the activation tiles inside this loop put a cross-warp amax reduction on every
        # K step's critical path: +7 µs at Flash wq_b M1 on the H200, docs/performance.md "Session 10".)
        a, a_scale = act_quant_triton(x, act_block)
        if not fp8_hw:
            a = a.view(torch.uint8)
    w = weight if fp8_hw else weight.view(torch.uint8)
    fused = swiglu_limit is not None
    if fused and split_n % cfg["BLOCK_N"]:
        raise ValueError(f"the fused SwiGLU needs I ({split_n}) to be a multiple of BLOCK_N ({cfg['BLOCK_N']})")
    y = torch.empty(m, split_n if fused else n, dtype=x.dtype, device=x.device)
    if m == 0 or n == 0:
        return y
    flags = dict(BN=bn, BK=bk, AB=ab, ACT_FP8=act_block is not None, FP8_DOT=fp8_hw and act_block is not None,
                 NATIVE_FP8=fp8_hw, POST_SCALE=post, IEEE=x.dtype == torch.float32 and act_block is None,
                 BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                 num_warps=cfg["num_warps"], num_stages=cfg["num_stages"])
    pdl = pdl_launch(x)
    if not decode:
        grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]))
        _fp8_linear_prefill_kernel[grid](a, a_scale, w, scale, y, m, n, k, a.stride(0), a_scale.stride(0),
                                         w.stride(0), scale.stride(0), y.stride(0), **flags, **pdl)
        return y
    n_tiles = triton.cdiv(n, cfg["BLOCK_N"])
    k_steps = triton.cdiv(k, cfg["BLOCK_K"])
    splits = split_k or decode_split_k(split_n, k_steps, x.device)
    k_per_split = triton.cdiv(k_steps, splits) * cfg["BLOCK_K"]
    splits = triton.cdiv(k, k_per_split)
    sum_last = sum_last and splits > 1
    part = y if splits == 1 and not fused else torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    tickets = split_counters(arrivals, n_tiles, x.device) if sum_last or fused else y
    _fp8_linear_decode_kernel[(n_tiles, splits)](
        a, a_scale, w, scale, part, y, tickets, m, n, k, k_per_split, a.stride(0), a_scale.stride(0), w.stride(0),
        scale.stride(0), y.stride(0), SPLITS=splits, SUM_LAST=sum_last, **flags, **pdl,
        **(dict(limit=float(swiglu_limit), SWIGLU=True) if fused else {}))
    if splits > 1 and not sum_last and not fused:
        split_k_sum(part, y, pdl)
    return y
