"""Triton kernels of the FP8 block-scaled linear and of the official activation quantization.

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

Decode (M <= 16, or M <= DECODE_MAX_M = 64 where the prefill tiles would not fill the GPU) is
bandwidth-bound: BLOCK_M (16, 32 or 64) covers every row, so each weight byte crosses HBM once;
the K range is split over SPLIT_K programs per N tile when N / BLOCK_N alone would not fill the
GPU, each writing an fp32 partial [SPLIT_K, M, N] that a second kernel sums in split order
(deterministic) and rounds (PDL overlaps its launch; summing in the last-arriving program of each
tile instead, one launch in all, measured ~1 µs slower at M = 1 on the H200: docs/performance.md
"Session 10"). Prefill uses large tiles and writes y directly.

Activation quantization (one program per row and BLOCK_G channels, groups of `block` channels):
s = 2^ceil(log2(max(amax, 1e-4) * fp32(1/448))) from the fp32 bits, t = clamp(x * (1/s), +-448)
(1/s is an exact power of two), q = t rounded to the e4m3 grid with round-to-nearest-even by
adding and subtracting 1.5 * 2^23 at the code's quantum (exact fp32 arithmetic, the same on every
GPU and in the interpreter), stored as the e4m3 byte built from q's fp32 bits.
"""

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch
from v4serve.ops.quant_decode_triton import e4m3_bits_to_f32

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
ACT_QUANT_CONFIG = dict(BLOCK_G=1024, num_warps=4)
# Split-K until the decode grid has at least this many programs per SM.
DECODE_PROGRAMS_PER_SM = 2
SPLIT_K_SUM_BLOCK = 1024


@triton.jit
def _e4m3_byte(mag, negative):
    """The e4m3 byte of +-mag (mag >= 0 an fp32 value on the e4m3 grid, <= 448)."""
    bits = mag.to(tl.int32, bitcast=True)
    normal = ((((bits >> 23) & 0xFF) - 120) << 3) | ((bits >> 20) & 7)
    byte = tl.where(mag >= 0.015625, normal, (mag * 512.0).to(tl.int32))
    return (byte | tl.where(negative, 0x80, 0)).to(tl.uint8)


@triton.jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s,
                      GROUP: tl.constexpr, BLOCK_G: tl.constexpr):
    """Program (row, g): e4m3 codes of x[row, g * BLOCK_G:][:BLOCK_G] and the scales of its
    BLOCK_G // GROUP groups (fp32 arithmetic on exponent bits, see the module docstring)."""
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    xg = tl.reshape(x, (BLOCK_G // GROUP, GROUP))
    amax = tl.maximum(tl.max(tl.abs(xg), 1), 1e-4)
    ratio = (amax * (1.0 / 448.0)).to(tl.int32, bitcast=True)
    exp = ((ratio >> 23) & 0xFF) - 127 + ((ratio & 0x7FFFFF) != 0).to(tl.int32)  # ceil(log2(ratio))
    s = ((exp + 127) << 23).to(tl.float32, bitcast=True)
    inv_s = ((127 - exp) << 23).to(tl.float32, bitcast=True)
    t = tl.minimum(tl.maximum(xg * inv_s[:, None], -448.0), 448.0)
    a = tl.abs(t)
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)  # the code's exponent
    up = ((130 - e) << 23).to(tl.float32, bitcast=True)  # 2^(3-e): one quantum becomes 1
    down = ((124 + e) << 23).to(tl.float32, bitcast=True)
    r = ((a * up + 12582912.0) - 12582912.0) * down  # round half to even at the quantum
    byte = _e4m3_byte(r, t.to(tl.int32, bitcast=True) < 0)  # the sign bit of t: -0 -> 0x80, as torch's cast
    tl.store(q_ptr + row * stride_q + offs, tl.reshape(byte, (BLOCK_G,)), mask=mask)
    groups = tl.program_id(1) * (BLOCK_G // GROUP) + tl.arange(0, BLOCK_G // GROUP)
    tl.store(s_ptr + row * stride_s + groups, s, mask=groups * GROUP < K)


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
    x_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, M, N, K, k_per_split, stride_x, stride_xs, stride_w, stride_ws,
    stride_os, stride_om,
    BN: tl.constexpr, BK: tl.constexpr, AB: tl.constexpr, ACT_FP8: tl.constexpr, FP8_DOT: tl.constexpr,
    NATIVE_FP8: tl.constexpr, POST_SCALE: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (n, split): every row of x against BLOCK_N weight rows over one K range; writes
    y (one split) or its fp32 partial out[split] (k_per_split is a multiple of BLOCK_K)."""
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
    tl.store(out_ptr + split.to(tl.int64) * stride_os + offs_m[:, None] * stride_om + offs_n[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _split_k_sum_kernel(part_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    """y[i] = sum over s in order of part[s, i] (fp32), rounded once."""
    if PDL:
        gdc_wait()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < MN
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(part_ptr + s * MN + offs, mask=mask, other=0.0)
    tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=mask)


@functools.lru_cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.lru_cache
def _has_fp8(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (8, 9)


def native_fp8(device: torch.device) -> bool:
    """fp8 loads, conversions and dots: sm_89+ (not sm_80), and the interpreter."""
    return not compiled_on_cuda(device) or _has_fp8(device.index if device.index is not None else torch.cuda.current_device())


def act_quant_triton(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    if block & (block - 1) or not 1 <= block <= ACT_QUANT_CONFIG["BLOCK_G"]:
        raise ValueError(f"the Triton act_quant needs a power-of-two block <= {ACT_QUANT_CONFIG['BLOCK_G']}, got {block}")
    if x.stride(-1) != 1:
        raise ValueError("x must have a unit stride along K")
    m, k = x.shape
    codes = torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device)
    scales = torch.empty(m, triton.cdiv(k, block), dtype=torch.float32, device=x.device)
    block_g = min(ACT_QUANT_CONFIG["BLOCK_G"], max(block, triton.next_power_of_2(k)))
    if m:
        _act_quant_kernel[(m, triton.cdiv(k, block_g))](
            x, codes.view(torch.uint8), scales, k, x.stride(0), codes.stride(0), scales.stride(0),
            GROUP=block, BLOCK_G=block_g, num_warps=ACT_QUANT_CONFIG["num_warps"])
    return codes, scales


def _use_decode_tiles(m: int, n: int, device: torch.device) -> bool:
    if m <= DECODE_ALWAYS_M or m > DECODE_MAX_M:
        return m <= DECODE_ALWAYS_M
    if not compiled_on_cuda(device):
        return True  # the interpreter: the tiles of the GPUs that take this path
    prefill_programs = triton.cdiv(m, FP8_PREFILL_CONFIG["BLOCK_M"]) * triton.cdiv(n, FP8_PREFILL_CONFIG["BLOCK_N"])
    return prefill_programs < _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def _split_k(n_tiles: int, k_steps: int, device: torch.device) -> int:
    if not compiled_on_cuda(device):
        return 1
    want = DECODE_PROGRAMS_PER_SM * _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return max(1, min(k_steps, triton.cdiv(want, n_tiles)))


def fp8_linear_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                      act_block: int | None, config: dict | None = None, split_k: int | None = None,
                      fp8_hw: bool | None = None) -> torch.Tensor:
    """y [M, N] for x [M, K]. `config` / `split_k` override the tiles and the decode K split (tests,
    benchmarks); `fp8_hw=False` forces the path of GPUs without fp8 (sm_80: codes decoded from bytes);"""
    m, k = x.shape
    n = weight.shape[0]
    bn, bk = block
    decode = _use_decode_tiles(m, n, x.device)
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight must have a unit stride along K")
    fp8_hw = native_fp8(x.device) if fp8_hw is None else fp8_hw
    if act_block is None:
        prefill_cfg = FP8_PREFILL_DEQUANT_CONFIG
    else:
        prefill_cfg = FP8_PREFILL_CONFIG if fp8_hw else FP8_PREFILL_SM80_CONFIG
    cfg = dict(config or (FP8_DECODE_CONFIG if decode else prefill_cfg))
    if decode and config is None:
        cfg["BLOCK_M"] = max(cfg["BLOCK_M"], triton.next_power_of_2(m))
    if act_block is None:
        post = bk % cfg["BLOCK_K"] == 0
        a, a_scale, ab = x, scale, 1  # (a_scale is not read in weight-only mode)
    else:
        if act_block & (act_block - 1) or bk & (bk - 1) or min(act_block, bk) < 16:
            raise ValueError(f"the Triton FP8 path needs power-of-two act_block and block_k >= 16, got "
                             f"act_block={act_block}, block={list(block)}")
        cfg["BLOCK_K"] = min(cfg["BLOCK_K"], act_block, bk)
        post = True
        ab = act_block
        # (Quantizing the activation tiles inside the decode kernel saved this launch but put a
        # cross-warp amax reduction on every K step's critical path: +7 µs at Flash wq_b M1 on the
        # H200, docs/performance.md "Session 10".)
        a, a_scale = act_quant_triton(x, act_block)
        if not fp8_hw:
            a = a.view(torch.uint8)
    w = weight if fp8_hw else weight.view(torch.uint8)
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
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
    splits = split_k or _split_k(n_tiles, k_steps, x.device)
    k_per_split = triton.cdiv(k_steps, splits) * cfg["BLOCK_K"]
    splits = triton.cdiv(k, k_per_split)
    out = y if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    _fp8_linear_decode_kernel[(n_tiles, splits)](
        a, a_scale, w, scale, out, m, n, k, k_per_split, a.stride(0), a_scale.stride(0), w.stride(0),
        scale.stride(0), out.stride(0) if splits > 1 else 0, out.stride(-2), **flags, **pdl)
    if splits > 1:
        _split_k_sum_kernel[(triton.cdiv(m * n, SPLIT_K_SUM_BLOCK),)](
            out, y, m * n, SPLIT_K=splits, BLOCK=SPLIT_K_SUM_BLOCK, **pdl)
    return y
