"""Triton kernel of the MXFP4 (W4A16) grouped matmul: y[m] = x[rows[m]] @ W[g(m)]^T.

Layouts (K_BYTES = K / 2 and K_SCALES = K / 32 are passed so the JIT sees them 16-divisible and
the packed / scale rows load in 16-byte / 4-byte pieces): x [T, K] (row stride `stride_x`, unit column stride), bf16 / fp16 / fp32; weight uint8
[E, N, K/2] packed e2m1 (element 2j in the low nibble of byte j); scale uint8 ue8m0 [E, N, K/32];
rows [M] int64 sorted by group, or none (row m = pick m); ends [E] int32 cumulative group ends;
y [M, N] in x.dtype.

Schedule (as `grouped_matmul_triton`): group e owns cdiv(size_e, BLOCK_M) blocks of picks, numbered
after the blocks of the groups before it; every program derives its group, first and last pick
from `ends` in registers (no setup launch, no host count: CUDA-graph safe). Grid
(cdiv(M, BLOCK_M) + E, cdiv(N, BLOCK_N)); programs past the last block exit at once.

Per K step a program loads its [BLOCK_N, BLOCK_K/2] packed bytes and [BLOCK_N, BLOCK_K/32] scale
bytes once (one int32 word per row when BLOCK_K = 128 and K % 128 == 0: SCALE_WORDS), splits the nibbles (join low/high -> element order 2j, 2j+1), decodes them to fp32 and
multiplies by 2^(b-127) (exact: at most two significant bits), casts to x.dtype (exact in bf16) and
runs a tensor-core dot with fp32 accumulation (fp32 x: an IEEE fp32 dot). So y differs from the
reference (fp32 products, fp32 sums) only in the order of the fp32 sums. The weights cross HBM once
per (block of picks, expert): in decode, where an expert has a few picks, that is the packed bytes
of the experts touched.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.grouped_matmul_triton import group_block
from v4serve.ops.quant_decode_triton import e2m1_to_f32, ue8m0_to_f32

# Decode: a handful of picks per expert. Prefill: tens of picks per expert (2048 tokens x 6 / 256).
MXFP4_DECODE_CONFIG = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
MXFP4_PREFILL_CONFIG = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
# Average picks per expert from which the prefill tiles pay off.
PREFILL_PICKS_PER_EXPERT = 32


@triton.jit
def _mxfp4_grouped_matmul_kernel(
    x_ptr, w_ptr, s_ptr, rows_ptr, ends_ptr, y_ptr,
    N, K, K_BYTES, K_SCALES, stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_y,
    N_GROUPS: tl.constexpr, HAS_ROWS: tl.constexpr, IEEE: tl.constexpr, SCALE_WORDS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, PDL: tl.constexpr = False,
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
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :],
                    mask=mask_m[:, None] & (offs_k[None, :] < K), other=0.0)
        offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
        packed = tl.load(w_rows + offs_b[None, :], mask=mask_n[:, None] & (offs_b[None, :] < K_BYTES),
                         other=0).to(tl.int32)
        if SCALE_WORDS:  # BLOCK_K = 128: the 4 scale bytes of a row are one aligned int32 word
            word = tl.load(s_rows.to(tl.pointer_type(tl.int32)) + k0 // 128, mask=mask_n[:, None], other=0)
            sb = (word >> (tl.arange(0, 4) * 8)[None, :]) & 0xFF
        else:
            offs_s = k0 // 32 + tl.arange(0, BLOCK_K // 32)
            sb = tl.load(s_rows + offs_s[None, :], mask=mask_n[:, None] & (offs_s[None, :] < K_SCALES),
                         other=127).to(tl.int32)
        codes = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_N, BLOCK_K))
        w = tl.reshape(e2m1_to_f32(codes), (BLOCK_N, BLOCK_K // 32, 32)) * ue8m0_to_f32(sb)[:, :, None]
        b = tl.trans(tl.reshape(w, (BLOCK_N, BLOCK_K)).to(a.dtype))
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :],
             acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _scale_words(scale: torch.Tensor, k: int, block_k: int) -> bool:
    """The scales can be read as int32 words: 4 per 128 channels, rows and base 4-byte aligned."""
    return (block_k == 128 and k % 128 == 0 and scale.data_ptr() % 4 == 0
            and all(st % 4 == 0 for st in scale.stride()[:2]))


def mxfp4_config(n_picks: int, n_experts: int) -> dict:
    """The tiles for a call: prefill tiles once experts average PREFILL_PICKS_PER_EXPERT picks."""
    return MXFP4_PREFILL_CONFIG if n_picks >= PREFILL_PICKS_PER_EXPERT * n_experts else MXFP4_DECODE_CONFIG


def mxfp4_grouped_matmul_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor | None,
                                ends: torch.Tensor, n_picks: int, config: dict | None = None) -> torch.Tensor:
    e, n, half_k = weight.shape
    k = 2 * half_k
    cfg = config or mxfp4_config(n_picks, e)
    block_m = cfg["BLOCK_M"]
    y = torch.empty(n_picks, n, dtype=x.dtype, device=x.device)
    if n_picks == 0:
        return y
    grid = (triton.cdiv(n_picks, block_m) + e, triton.cdiv(n, cfg["BLOCK_N"]))
    _mxfp4_grouped_matmul_kernel[grid](
        x, weight, scale, rows if rows is not None else ends, ends, y, n, k, k // 2, k // 32, x.stride(0), weight.stride(0),
        weight.stride(1), scale.stride(0), scale.stride(1), y.stride(0), N_GROUPS=e, HAS_ROWS=rows is not None,
        IEEE=x.dtype == torch.float32, SCALE_WORDS=_scale_words(scale, k, cfg["BLOCK_K"]), BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        BLOCK_E=triton.next_power_of_2(e), num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **pdl_launch(x),
    )
    return y
