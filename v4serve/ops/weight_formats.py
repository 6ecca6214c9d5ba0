"""Codecs of the quantized WEIGHT formats of the DeepSeek-V4 checkpoints (torch, any device).

Bit layouts
-----------
e4m3 (torch.float8_e4m3fn, "F8_E4M3"): 1 sign | 4 exponent (bias 7) | 3 mantissa bits.
    normal (e > 0): (-1)^s * 2^(e-7) * (1 + m/8); subnormal (e == 0): (-1)^s * 2^-6 * m/8 = m * 2^-9;
    0x7F / 0xFF are NaN (no infinities); largest finite 448.
ue8m0 ("F8_E8M0", OCP E8M0): 8 exponent bits, no sign, no mantissa: value 2^(b - 127) for b = 0..254,
    b = 255 is NaN. b = 0 is 2^-127, a subnormal fp32 (still exact in fp32 and bf16).
e2m1 (OCP FP4, one nibble): bit 3 = sign, bits 0-2 = magnitude code c: magnitudes
    c:  0   1   2   3    4   5   6   7
    |v| 0  .5   1  1.5   2   3   4   6
    Packed two per byte ("I8" [out, in/2], the bytes of torch.float4_e2m1fn_x2): element 2j in the
    low nibble, element 2j+1 in the high nibble.

Weight tensors
--------------
FP8 block-scaled linear (V4, V4-Pro: 128x128 blocks; V4.1: 32x32; V4-Flash-Base: fp32 scales):
    weight e4m3 [N, K], scale [ceil(N/bn), ceil(K/bk)] (ue8m0 bytes, converted to float32 at load),
    W[n, k] = e4m3(weight[n, k]) * scale[n // bn, k // bk]; the edge blocks may be partial.
MXFP4 routed experts: weight uint8 [..., N, K/2] packed e2m1, scale uint8 ue8m0 [..., N, K/32],
    W[n, k] = e2m1(nibble k of row n) * 2^(scale[n, k // 32] - 127).
Every dequantized value has at most 3 (e4m3) or 2 (e2m1) significant bits, so with a power-of-two
scale it is exact in bf16 (and fp32) unless the product leaves the exponent range.

The encoders (for random presets and test checkpoints) round like the activation / KV quantizers
of the reference (`kv_quant_reference`): ue8m0 scale 2^ceil(log2(amax / qmax)), e4m3 and e2m1
round-to-nearest-even on the clamped quotient.
"""

import torch

from v4serve.ops.kv_quant_reference import E2M1_MAX, E4M3_MAX, round_e2m1, round_e4m3, ue8m0_scale

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MXFP4_BLOCK = 32
# Smallest amax a quantizer scales for (below it the block is scaled as if amax were this).
WEIGHT_FP8_SCALE_FLOOR = 1e-4
WEIGHT_FP4_SCALE_FLOOR = 6.0 * 2.0**-126


def e2m1_table(device=None) -> torch.Tensor:
    """float32 [16]: the value of every e2m1 code (codes 8..15 are the negatives; code 8 is -0)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def decode_ue8m0(b: torch.Tensor) -> torch.Tensor:
    """uint8 ue8m0 bytes -> float32 2^(b - 127) (exact; b = 255 -> NaN)."""
    if b.dtype not in (torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)):
        raise ValueError(f"ue8m0 scales must be uint8 (or float8_e8m0fnu) bytes, got {b.dtype}")
    b = b.view(torch.uint8).to(torch.int32)
    # 2^(b-127) as fp32 bits: exponent field b for b >= 1, the subnormal 0x00400000 for b = 0.
    bits = torch.where(b == 0, torch.full_like(b, 0x00400000), b << 23)
    return torch.where(b == 255, torch.full_like(b, 0x7FC00000), bits).view(torch.float32)


def encode_ue8m0(s: torch.Tensor) -> torch.Tensor:
    """float32 powers of two in [2^-127, 2^127] -> uint8 ue8m0 bytes; anything else is refused."""
    s = s.float()
    b = torch.log2(s)
    if not torch.all((b == b.round()) & (b >= -127) & (b <= 127)):
        raise ValueError("ue8m0 scales must be powers of two in [2^-127, 2^127]")
    return (b.round() + 127).to(torch.uint8)


def decode_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """uint8 [..., K/2] packed e2m1 -> float32 [..., K] (element 2j from the low nibble)."""
    if packed.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"packed e2m1 must be uint8 (or int8) bytes, got {packed.dtype}")
    p = packed.view(torch.uint8).to(torch.int64)
    codes = torch.stack([p & 0xF, p >> 4], -1).flatten(-2)
    return e2m1_table(packed.device)[codes]


def encode_e2m1(values: torch.Tensor) -> torch.Tensor:
    """float [..., K] (K even) -> uint8 [..., K/2]: each value rounded to the e2m1 grid (nearest,
    ties to the even code, clamped to +-6), its sign bit kept (-0 -> code 8), packed low nibble first."""
    if values.shape[-1] % 2:
        raise ValueError(f"e2m1 packing needs an even last dim, got {values.shape[-1]}")
    v = values.float()
    r = round_e2m1(v.clamp(-E2M1_MAX, E2M1_MAX)).abs()
    mags = torch.tensor(E2M1_MAGNITUDES, device=v.device)
    code = torch.searchsorted(mags, r.contiguous()).to(torch.uint8) | (torch.signbit(v).to(torch.uint8) << 3)
    pairs = code.reshape(*code.shape[:-1], -1, 2)
    return pairs[..., 0] | (pairs[..., 1] << 4)


def _expand_blocks(scale: torch.Tensor, block: tuple[int, int], n: int, k: int) -> torch.Tensor:
    bn, bk = block
    return scale.repeat_interleave(bn, -2)[..., :n, :].repeat_interleave(bk, -1)[..., :k]


def fp8_scale_shape(n: int, k: int, block: tuple[int, int]) -> tuple[int, int]:
    """[ceil(N / bn), ceil(K / bk)]: one scale per (partial) block."""
    return (-(-n // block[0]), -(-k // block[1]))


def fp8_weight_bytes(n: int, k: int, block: tuple[int, int]) -> int:
    """Bytes of an FP8 block-scaled [N, K] weight: one e4m3 byte an element, one fp32 scale a block."""
    sn, sk = fp8_scale_shape(n, k, block)
    return n * k + 4 * sn * sk


def check_fp8_weight(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int]) -> None:
    """Errors that name the bad field of an FP8 block-scaled weight."""
    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"block must be (block_n, block_k) >= 1, got {block}")
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ValueError(f"weight must be float8_e4m3fn [N, K], got {weight.dtype} {tuple(weight.shape)}")
    want = fp8_scale_shape(*weight.shape, block)
    if scale.dtype != torch.float32 or tuple(scale.shape) != want:
        raise ValueError(f"scale must be float32 {list(want)} for weight {list(weight.shape)} and block {list(block)}, "
                         f"got {scale.dtype} {list(scale.shape)}")


def dequantize_fp8_blocks(weight: torch.Tensor, scale: torch.Tensor, block=(128, 128)) -> torch.Tensor:
    """float32 [N, K]: W[n, k] = e4m3(weight[n, k]) * scale[n // bn, k // bk] (fp32 product)."""
    check_fp8_weight(weight, scale, tuple(block))
    return weight.float() * _expand_blocks(scale, tuple(block), *weight.shape)


def quantize_fp8_blocks(w: torch.Tensor, block=(128, 128), scale_fmt: str = "ue8m0"):
    """(weight e4m3 [N, K], scale float32 [ceil(N/bn), ceil(K/bk)]) with amax per block:
    scale_fmt "ue8m0": s = 2^ceil(log2(max(amax, 1e-4) / 448)); "fp32": s = max(amax, 1e-4) / 448."""
    if w.dim() != 2:
        raise ValueError(f"w must be [N, K], got {tuple(w.shape)}")
    n, k = w.shape
    bn, bk = block
    sn, sk = fp8_scale_shape(n, k, block)
    padded = torch.zeros(sn * bn, sk * bk, dtype=torch.float32, device=w.device)
    padded[:n, :k] = w.float()
    amax = padded.reshape(sn, bn, sk, bk).abs().amax((1, 3))
    if scale_fmt == "ue8m0":
        scale = ue8m0_scale(amax, E4M3_MAX, WEIGHT_FP8_SCALE_FLOOR)
    elif scale_fmt == "fp32":
        scale = amax.clamp(min=WEIGHT_FP8_SCALE_FLOOR) / E4M3_MAX
    else:
        raise ValueError(f"scale_fmt must be 'ue8m0' or 'fp32', got {scale_fmt!r}")
    q = round_e4m3((w.float() / _expand_blocks(scale, block, n, k)).clamp(-E4M3_MAX, E4M3_MAX))
    return q.to(torch.float8_e4m3fn), scale


def check_mxfp4_weight(weight: torch.Tensor, scale: torch.Tensor) -> None:
    """Errors that name the bad field of packed MXFP4 weights [..., N, K/2] + scales [..., N, K/32]."""
    if weight.dtype not in (torch.uint8, torch.int8):
        raise ValueError(f"weight must be uint8 packed e2m1 [..., N, K/2], got {weight.dtype}")
    if scale.dtype != torch.uint8:
        raise ValueError(f"scale must be uint8 ue8m0 [..., N, K/32], got {scale.dtype}")
    k = 2 * weight.shape[-1]
    if k % MXFP4_BLOCK or tuple(scale.shape) != (*weight.shape[:-1], k // MXFP4_BLOCK):
        raise ValueError(f"scale must be [..., N, K/32] = {[*weight.shape[:-1], k // MXFP4_BLOCK]} for packed "
                         f"weight {list(weight.shape)} (K = {k}, a multiple of 32), got {list(scale.shape)}")


def dequantize_mxfp4(weight: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """[..., N, K] in `dtype`: W[n, k] = e2m1(nibble k of row n) * 2^(scale[n, k // 32] - 127).
    Exact in float32 and bf16 (at most two significant bits) unless it overflows (b >= 253 with |v| = 6)."""
    check_mxfp4_weight(weight, scale)
    values = decode_e2m1(weight)
    s = decode_ue8m0(scale).repeat_interleave(MXFP4_BLOCK, -1)
    return (values * s).to(dtype)


def quantize_mxfp4(w: torch.Tensor):
    """(weight uint8 [..., N, K/2], scale uint8 [..., N, K/32]) of float w [..., N, K] (K % 32 == 0):
    s = 2^ceil(log2(max(amax, 6 * 2^-126) / 6)) per 32 along K, values e2m1 of clamp(w / s, +-6)."""
    k = w.shape[-1]
    if k % MXFP4_BLOCK:
        raise ValueError(f"MXFP4 needs K to be a multiple of 32, got {k}")
    blocks = w.float().reshape(*w.shape[:-1], k // MXFP4_BLOCK, MXFP4_BLOCK)
    s = ue8m0_scale(blocks.abs().amax(-1, keepdim=True), E2M1_MAX, WEIGHT_FP4_SCALE_FLOOR)
    packed = encode_e2m1((blocks / s).reshape(w.shape))
    return packed, encode_ue8m0(s.squeeze(-1))
