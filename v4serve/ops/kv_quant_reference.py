"""Torch references of the quantize -> dequantize round trips of the DeepSeek-V4 row formats.

All math is fp32; the result is rounded back to the input dtype (exact: a dequantized value has at
most 6 significant bits). Scales are per group of `block` consecutive channels, amax over the group:

    ue8m0 scale:  s = 2^ceil(log2(max(amax, floor) / qmax))       (a power of two)
    e4m3 scale:   s = e4m3_rne(max(amax, floor) / qmax)
    value:        v = round(clamp(x / s, -qmax, qmax)) * s

| round trip          | values | qmax | floor      | used for                                   |
| fp8_e4m3 / ue8m0    | e4m3   | 448  | 1e-4       | V4 window + compressed KV (block 64, first 448 channels), V4.1 window KV (block 32) |
| fp4_e2m1 / ue8m0    | e2m1   | 6    | 6 * 2^-126 | indexer q and k after `hadamard` (block 32) |
| fp4_e2m1 / e4m3     | e2m1   | 6    | 6 * 2^-9   | V4.1 main compressed KV (block 16)          |

Rounding is round-to-nearest-even. e4m3 uses torch's float8_e4m3fn cast (RNE); e2m1 (grid
0, .5, 1, 1.5, 2, 3, 4, 6) is written out below with its ties-to-even-code thresholds.
The indexer's rows are Hadamard-rotated first (`hadamard_reference.py`).
"""

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
FP8_SCALE_FLOOR = 1e-4
FP4_UE8M0_SCALE_FLOOR = 6.0 * 2.0**-126
FP4_E4M3_SCALE_FLOOR = 6.0 * 2.0**-9


def ue8m0_scale(amax: torch.Tensor, qmax: float, floor: float) -> torch.Tensor:
    """2^ceil(log2(max(amax, floor) / qmax)), with the ceil taken exactly from the fp32 bits."""
    ratio = amax.float().clamp(min=floor) / qmax
    bits = ratio.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((exponent + 127) << 23).view(torch.float32)


def round_e4m3(y: torch.Tensor) -> torch.Tensor:
    return y.to(torch.float8_e4m3fn).float()


def round_e2m1(y: torch.Tensor) -> torch.Tensor:
    """Nearest of {0, .5, 1, 1.5, 2, 3, 4, 6} (|y| <= 6), ties to the even code, sign kept."""
    a = y.abs()
    r = torch.where(a <= 0.25, 0.0, torch.where(a < 0.75, 0.5, torch.where(a <= 1.25, 1.0,
        torch.where(a < 1.75, 1.5, torch.where(a <= 2.5, 2.0, torch.where(a < 3.5, 3.0,
        torch.where(a <= 5.0, 4.0, 6.0)))))))
    return torch.copysign(r, y)


def _block_round_trip(x, block, n_quant, scale_fn, round_fn, qmax):
    d = x.shape[-1]
    if n_quant % block or n_quant > d:
        raise ValueError(f"quantized channels ({n_quant}) must be a multiple of the block ({block}) and <= dim ({d})")
    head = x[..., :n_quant].float().reshape(*x.shape[:-1], n_quant // block, block)
    s = scale_fn(head.abs().amax(-1, keepdim=True))
    value = round_fn((head / s).clamp(-qmax, qmax)) * s
    return torch.cat([value.reshape(*x.shape[:-1], n_quant).to(x.dtype), x[..., n_quant:]], -1)


def fp8_e4m3_ue8m0_round_trip(x: torch.Tensor, block: int, n_quant: int | None = None) -> torch.Tensor:
    """Channels [0, n_quant) (default: all) through e4m3 with a ue8m0 scale per `block`; the rest unchanged."""
    scale = lambda amax: ue8m0_scale(amax, E4M3_MAX, FP8_SCALE_FLOOR)  # noqa: E731
    return _block_round_trip(x, block, x.shape[-1] if n_quant is None else n_quant, scale, round_e4m3, E4M3_MAX)


def fp4_e2m1_ue8m0_round_trip(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """All channels through e2m1 with a ue8m0 scale per `block` (OCP MXFP4)."""
    scale = lambda amax: ue8m0_scale(amax, E2M1_MAX, FP4_UE8M0_SCALE_FLOOR)  # noqa: E731
    return _block_round_trip(x, block, x.shape[-1], scale, round_e2m1, E2M1_MAX)


def fp4_e2m1_e4m3_round_trip(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    """All channels through e2m1 with an e4m3 scale per `block` (NVFP4 without the global scale)."""
    scale = lambda amax: round_e4m3(amax.float().clamp(min=FP4_E4M3_SCALE_FLOOR) / E2M1_MAX)  # noqa: E731
    return _block_round_trip(x, block, x.shape[-1], scale, round_e2m1, E2M1_MAX)
