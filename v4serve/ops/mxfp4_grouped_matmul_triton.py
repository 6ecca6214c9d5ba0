"""Triton kernel of the MXFP4 (W4A16) grouped matmul: y[m] = x[rows[m]] @ W[g(m)]^T, optionally
with the clamped SwiGLU of the two halves of W's rows fused into its epilogue.

Layouts (K_BYTES = K / 2 and K_SCALES = K / 32 are passed so the JIT sees them 16-divisible): x
[T, K] (row stride `stride_x`, unit column stride), bf16 / fp16 / fp32; weight uint8 [E, N_W, K/2]
packed e2m1 (element 2j in the low nibble of byte j); scale uint8 ue8m0 [E, N_W, K/32]; rows [M]
int64 sorted by group, or none (row m = pick m); ends [E] int32 cumulative group ends; y [M, N] in
x.dtype, N = N_W, or N = N_W / 2 with SWIGLU: rows 0..N-1 of W are the gate, N..2N-1 the up
projection, and y = silu(min(gate, L)) * clamp(up, -L, L) rounded as `clamped_swiglu` rounds it.

Schedule: group e owns cdiv(size_e, BLOCK_M) blocks of picks, numbered after the blocks of the
groups before it; every program derives its group, first and last pick from `ends` in registers
(`group_block`: no setup launch, no host count, CUDA-graph safe). Grid (cdiv(M, BLOCK_M) +
min(E, M), cdiv(N, BLOCK_N)): at most min(E, M) groups have picks, so that many blocks more than
cdiv(M, BLOCK_M) cover every case, and a decode step (M = 6 picks) launches 7 blocks of programs,
not E + 1 (the session-9 kernel launched 257 x 64 programs for 6 x 64 that work).

Per K step of BLOCK_K elements a program loads its [BLOCK_N, BLOCK_K/2] packed bytes (16-byte
loads) and their scales (int32 words, 4 scales per 128 elements, when K % 128 == 0: SCALE_WORDS),
and decodes the low nibbles (the even elements) and the high nibbles (the odd elements) into two
tiles (mxfp4_decode_triton.py: bit placement and two exact multiplies; `DECODE_ASM` does four bytes
per PTX block with bf16x2 arithmetic). The activations' columns are split the same way (even, odd)
and the step is two tensor-core dots, fp32 accumulation: the sum over K is taken in another order
than the reference's, and every product is exact (bf16 x, weights exact in bf16), so y differs
from the reference (fp32 products of the exactly decoded weights, fp32 sums) only in the order of
the fp32 sums. The weights cross HBM once per (block of picks, expert): in decode, where an expert
has a few picks, that is the packed bytes of the experts touched. W_AS_A computes the transposed
product (acc^T = W x^T: the weight rows are the MMA's M dimension) and transposes it at the end.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch
from v4serve.ops.grouped_matmul_triton import group_block
from v4serve.ops.mxfp4_decode_triton import decode_asm, decode_bits, ue8m0_to_bf16
from v4serve.ops.quant_decode_triton import ue8m0_to_f32
from v4serve.ops.swiglu_triton import clamped_swiglu_f32

# Decode: a handful of picks per expert, so the weight bytes and their decode bind: 16-pick blocks
# (the least a tensor-core dot takes), 64-byte row segments a step in a 4-deep cp.async ring, ~100-128
# registers (4 CTAs an SM fit). With SWIGLU, BLOCK_N counts output columns: a program reads 2 x
# BLOCK_N weight rows (gate and up), so the N tiles are halved to keep as many programs (6 experts x
# 64 at one token, 2.9 per SM of an H200). W_AS_A (weights as the dot's first operand) is an option.
MXFP4_DECODE_CONFIG = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4)
MXFP4_DECODE_SWIGLU_CONFIG = dict(BLOCK_M=16, BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=4)
# Prefill: tens of picks per expert (2048 tokens x 6 / 256): each weight tile is decoded once per
# block of 64 picks (about once per expert); 4 warps, 2-3 CTAs an SM (gate_up: a 2-deep ring, as 3
# spills on sm_80 under Triton 3.9).
MXFP4_PREFILL_CONFIG = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
MXFP4_PREFILL_SWIGLU_CONFIG = dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=2)
# Average picks per expert from which the prefill tiles pay off.
PREFILL_PICKS_PER_EXPERT = 32
DECODES = ("asm", "bits")
# The weight decoder for bf16 activations on compiled CUDA ("bits": the integer one, as elsewhere).
CUDA_BF16_DECODE = "asm"


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _weight_tile_dot(acc, a_even, a_odd, w_rows, s_rows, k0, mask_n, K_BYTES, K_SCALES,
                     IEEE: tl.constexpr, SCALE_WORDS: tl.constexpr, DECODE_ASM: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_AS_A: tl.constexpr):
    """acc + a_even @ W_even^T + a_odd @ W_odd^T (transposed with W_AS_A) for one K step of the
    weight rows at `w_rows` ([BLOCK_N, 1] pointers to the rows' packed bytes; `s_rows` to their scales)."""
    offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
    packed = tl.load(w_rows + offs_b[None, :], mask=mask_n[:, None] & (offs_b[None, :] < K_BYTES), other=0)
    if SCALE_WORDS:  # the scales of 128 elements are one aligned int32 word
        offs_w = k0 // 128 + tl.arange(0, BLOCK_K // 128)
        words = tl.load(s_rows.to(tl.pointer_type(tl.int32)) + offs_w[None, :],
                        mask=mask_n[:, None] & (offs_w[None, :] < K_SCALES // 4), other=0)
        sb = tl.reshape((words[:, :, None] >> (tl.arange(0, 4) * 8)[None, None, :]) & 0xFF, (BLOCK_N, BLOCK_K // 32))
    else:
        offs_s = k0 // 32 + tl.arange(0, BLOCK_K // 32)
        sb = tl.load(s_rows + offs_s[None, :], mask=mask_n[:, None] & (offs_s[None, :] < K_SCALES),
                     other=127).to(tl.int32)
    # byte j of the step holds elements 2j, 2j+1 of scale block j // 16
    packed = tl.reshape(packed, (BLOCK_N, BLOCK_K // 32, 16))
    if DECODE_ASM:
        scale = tl.broadcast_to(ue8m0_to_bf16(sb)[:, :, None], (BLOCK_N, BLOCK_K // 32, 16))
        even, odd = decode_asm(packed, scale)
    else:
        scale = tl.broadcast_to(ue8m0_to_f32(sb)[:, :, None], (BLOCK_N, BLOCK_K // 32, 16))
        even, odd = decode_bits(packed.to(tl.int32), scale)
    even = tl.reshape(even, (BLOCK_N, BLOCK_K // 2)).to(a_even.dtype)
    odd = tl.reshape(odd, (BLOCK_N, BLOCK_K // 2)).to(a_odd.dtype)
    if W_AS_A:  # acc^T [BLOCK_N, BLOCK_M] += W x^T: the weight rows fill the MMA's M (wgmma: 64 rows)
        acc = _dot(even, tl.trans(a_even), acc, IEEE)
        acc = _dot(odd, tl.trans(a_odd), acc, IEEE)
    else:  # acc [BLOCK_M, BLOCK_N] += x W^T
        acc = _dot(a_even, tl.trans(even), acc, IEEE)
        acc = _dot(a_odd, tl.trans(odd), acc, IEEE)
    return acc


@triton.jit
def _mxfp4_grouped_matmul_kernel(
    x_ptr, w_ptr, s_ptr, rows_ptr, ends_ptr, y_ptr,
    N, K, K_BYTES, K_SCALES, stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_y, limit,
    N_GROUPS: tl.constexpr, HAS_ROWS: tl.constexpr, IEEE: tl.constexpr, SCALE_WORDS: tl.constexpr,
    DECODE_ASM: tl.constexpr, SWIGLU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, W_AS_A: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
    e, offs_m, mask_m = group_block(ends_ptr, tl.program_id(0), N_GROUPS, BLOCK_M, BLOCK_E)
    if e >= N_GROUPS:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    if HAS_ROWS:
        rows = tl.load(rows_ptr + offs_m, mask=mask_m, other=0)
    else:
        rows = offs_m.to(tl.int64)
    w_rows = w_ptr + e.to(tl.int64) * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
    s_rows = s_ptr + e.to(tl.int64) * stride_se + offs_n.to(tl.int64)[:, None] * stride_sn
    if W_AS_A:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros_like(acc)  # SWIGLU: the up rows N..2N-1
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :],
                    mask=mask_m[:, None] & (offs_k[None, :] < K), other=0.0)
        a_even, a_odd = tl.split(tl.reshape(a, (BLOCK_M, BLOCK_K // 2, 2)))
        acc = _weight_tile_dot(acc, a_even, a_odd, w_rows, s_rows, k0, mask_n, K_BYTES, K_SCALES,
                               IEEE, SCALE_WORDS, DECODE_ASM, BLOCK_N, BLOCK_K, W_AS_A)
        if SWIGLU:
            acc_up = _weight_tile_dot(acc_up, a_even, a_odd, w_rows + N * stride_wn, s_rows + N * stride_sn, k0,
                                      mask_n, K_BYTES, K_SCALES, IEEE, SCALE_WORDS, DECODE_ASM, BLOCK_N, BLOCK_K,
                                      W_AS_A)
    if W_AS_A:
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)
    dtype = y_ptr.dtype.element_ty
    if SWIGLU:  # gate and up rounded to y's dtype first, as the unfused matmul stores them
        out = clamped_swiglu_f32(acc.to(dtype).to(tl.float32), acc_up.to(dtype).to(tl.float32), limit, dtype)
    else:
        out = acc.to(dtype)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :], out,
             mask=mask_m[:, None] & mask_n[None, :])


def _scale_words(scale: torch.Tensor, k: int, block_k: int) -> bool:
    """The scales can be read as int32 words: 4 per 128 channels, rows and base 4-byte aligned."""
    return (block_k % 128 == 0 and k % 128 == 0 and scale.data_ptr() % 4 == 0
            and all(st % 4 == 0 for st in scale.stride()[:2]))


def mxfp4_config(n_picks: int, n_experts: int, swiglu: bool = False) -> dict:
    """The tiles for a call: prefill tiles once experts average PREFILL_PICKS_PER_EXPERT picks."""
    if n_picks >= PREFILL_PICKS_PER_EXPERT * n_experts:
        return MXFP4_PREFILL_SWIGLU_CONFIG if swiglu else MXFP4_PREFILL_CONFIG
    return MXFP4_DECODE_SWIGLU_CONFIG if swiglu else MXFP4_DECODE_CONFIG


def default_decode(x: torch.Tensor) -> str:
    """CUDA_BF16_DECODE (the bf16x2 PTX block) for bf16 activations on compiled CUDA; "bits"
    otherwise (the interpreter has no PTX; fp16 / fp32 activations take fp32 weights)."""
    return CUDA_BF16_DECODE if x.dtype == torch.bfloat16 and compiled_on_cuda(x.device) else "bits"


def mxfp4_grouped_matmul_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor | None,
                                ends: torch.Tensor, n_picks: int, config: dict | None = None,
                                swiglu_limit: float | None = None) -> torch.Tensor:
    """`config`: the tiles (BLOCK_M / N / K, num_warps, num_stages) and optionally DECODE ("asm",
    "bits"; default `default_decode`) and W_AS_A (default False); None: `mxfp4_config`."""
    e, n_w, half_k = weight.shape
    k = 2 * half_k
    swiglu = swiglu_limit is not None
    n = n_w // 2 if swiglu else n_w
    cfg = config or mxfp4_config(n_picks, e, swiglu)
    decode = cfg.get("DECODE") or default_decode(x)
    if decode not in DECODES or (decode == "asm" and x.dtype != torch.bfloat16):
        raise ValueError(f"DECODE must be one of {DECODES} ('asm' for bf16 activations), got {decode!r} for {x.dtype}")
    block_m = cfg["BLOCK_M"]
    y = torch.empty(n_picks, n, dtype=x.dtype, device=x.device)
    if n_picks == 0:
        return y
    grid = (triton.cdiv(n_picks, block_m) + min(e, n_picks), triton.cdiv(n, cfg["BLOCK_N"]))
    _mxfp4_grouped_matmul_kernel[grid](
        x, weight, scale, rows if rows is not None else ends, ends, y, n, k, k // 2, k // 32, x.stride(0),
        weight.stride(0), weight.stride(1), scale.stride(0), scale.stride(1), y.stride(0),
        float(swiglu_limit) if swiglu else 0.0,
        N_GROUPS=e, HAS_ROWS=rows is not None, IEEE=x.dtype == torch.float32,
        SCALE_WORDS=_scale_words(scale, k, cfg["BLOCK_K"]), DECODE_ASM=decode == "asm", SWIGLU=swiglu,
        BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], BLOCK_E=triton.next_power_of_2(e),
        W_AS_A=cfg.get("W_AS_A", False), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_launch(x),
    )
    return y
