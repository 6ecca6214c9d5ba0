"""Triton kernel of the official activation quantization (reference: fp8_linear_reference.py).

Layouts: x [M, K] (bf16 / fp16 / fp32, row stride `stride_x`, unit column stride); codes e4m3
[M, K] (written as their bytes); scales float32 [M, ceil(K / block)].

Math, per row and group of `block` consecutive channels (fp32 arithmetic on exponent bits, the
same on every GPU and in the interpreter):
  s = 2^ceil(log2(max(amax, 1e-4) * fp32(1/448)))      (ue8m0: read off the bits of the product)
  t = clamp(x * (1/s), +-448)                          (1/s is an exact power of two)
  q = t rounded to the e4m3 grid, ties to even: adding and subtracting 1.5 * 2^23 at the code's
      quantum (2^(e-3) for exponent e >= -6) rounds the mantissa exactly
  byte = the e4m3 encoding of q built from q's fp32 bits (sign from t's sign bit: -0 -> 0x80)

`quantize_groups` is the math on a [R, GROUP] tile; the activation-quantization kernel and the
decode kernel that quantizes its own activation tiles (fp8_linear_decode_triton.py) both call it,
so they produce the same bytes.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

ACT_QUANT_CONFIG = dict(BLOCK_G=1024, num_warps=4)


@triton.jit
def _e4m3_byte(mag, negative):
    """The e4m3 byte of +-mag (mag >= 0 an fp32 value on the e4m3 grid, <= 448)."""
    bits = mag.to(tl.int32, bitcast=True)
    normal = ((((bits >> 23) & 0xFF) - 120) << 3) | ((bits >> 20) & 7)
    byte = tl.where(mag >= 0.015625, normal, (mag * 512.0).to(tl.int32))
    return (byte | tl.where(negative, 0x80, 0)).to(tl.uint8)


@triton.jit
def quantize_groups(xg):
    """(e4m3 bytes uint8 [R, GROUP], scales fp32 [R]) of xg fp32 [R, GROUP], one group a row."""
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
    return _e4m3_byte(r, t.to(tl.int32, bitcast=True) < 0), s


@triton.jit
def _act_quant_kernel(x_ptr, q_ptr, s_ptr, K, stride_x, stride_q, stride_s,
                      GROUP: tl.constexpr, BLOCK_G: tl.constexpr, PDL: tl.constexpr = False):
    """Program (row, g): e4m3 codes of x[row, g * BLOCK_G:][:BLOCK_G] and the scales of its
    BLOCK_G // GROUP groups. PDL: the next kernel may launch at once (it waits for this grid
    before it reads what this one writes; the decode linear loads its weights meanwhile)."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_G + tl.arange(0, BLOCK_G)
    mask = offs < K
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    byte, s = quantize_groups(tl.reshape(x, (BLOCK_G // GROUP, GROUP)))
    tl.store(q_ptr + row * stride_q + offs, tl.reshape(byte, (BLOCK_G,)), mask=mask)
    groups = tl.program_id(1) * (BLOCK_G // GROUP) + tl.arange(0, BLOCK_G // GROUP)
    tl.store(s_ptr + row * stride_s + groups, s, mask=groups * GROUP < K)


def act_quant_triton(x: torch.Tensor, block: int, pdl: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn [M, K], scales float32 [M, ceil(K / block)]); `pdl`: launch options of
    `_dispatch.pdl_launch` (a programmatic dependent launch that lets its successor start early)."""
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
            GROUP=block, BLOCK_G=block_g, num_warps=ACT_QUANT_CONFIG["num_warps"], **(pdl or {}))
    return codes, scales
