"""DeepSeek-V4.1 checkpoint numerics as exact torch references (dequantize once at load, round the
activations the way the reference's GEMMs see them).

* FP8 weight: e4m3 `W [out, in]` with one ue8m0 scale per 32x32 tile `S [ceil(out/32), ceil(in/32)]`:
  `W_deq[o, i] = W[o, i] * S[o // 32, i // 32]`: an e4m3 value times a power of two, exact in bf16.
* MXFP4 weight: packed e2m1 `P [out, in/2]` int8 (element 2j in the low nibble, 2j+1 in the high one;
  bit 3 = sign, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6) with a ue8m0 scale per 32 along `in`
  `S [out, in/32]`: `W_deq[o, i] = e2m1(P) * S[o, i // 32]`, exact in bf16.
* Activations entering an FP8 / FP4 GEMM: e4m3 with a ue8m0 scale per 32 channels (the
  `fp8_e8m0_b32` round trip, `s = 2^ceil(log2(max(amax, 1e-4) / 448))`), dequantized values exact in bf16.
The GEMM of dequantized operands accumulates in fp32 as the reference's block products do (its
summation order differs: a one-ulp effect the golden tolerance covers).
"""

from __future__ import annotations

import torch

from v4serve.ops.kv_quant import apply_kv_format

E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
ACT_BLOCK = 32


def dequant_fp8_blocks(weight: torch.Tensor, scale: torch.Tensor, block: int = 32,
                       dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """e4m3 [out, in] x per-tile ue8m0 scale [ceil(out/b), ceil(in/b)] -> dtype [out, in]."""
    out, inp = weight.shape
    want = (-(-out // block), -(-inp // block))
    if tuple(scale.shape) != want:
        raise ValueError(f"FP8 weight {tuple(weight.shape)} needs a scale of {want} tiles, got {tuple(scale.shape)}")
    s = scale.float().repeat_interleave(block, 0)[:out].repeat_interleave(block, 1)[:, :inp]
    return (weight.float() * s).to(dtype)


def dequant_mxfp4(packed: torch.Tensor, scale: torch.Tensor, block: int = 32,
                  dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """packed e2m1 int8 [out, in/2] x ue8m0 [out, in/block] -> dtype [out, in]."""
    b = packed.view(torch.uint8).long()
    codes = torch.stack((b & 0xF, b >> 4), dim=-1).flatten(-2)  # [out, in]
    if scale.shape != (codes.shape[0], codes.shape[1] // block):
        raise ValueError(f"MXFP4 weight of {tuple(codes.shape)} values needs a scale of "
                         f"{(codes.shape[0], codes.shape[1] // block)}, got {tuple(scale.shape)}")
    values = E2M1_VALUES.to(packed.device)[codes]
    return (values * scale.float().repeat_interleave(block, 1)).to(dtype)


def act_quant(x: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """What an FP8 GEMM sees of its input x [..., K]: e4m3 / ue8m0 per 32 channels, in x.dtype (the
    `fp8_e8m0_b32` round trip: the Triton kernel of ops/kv_quant.py on CUDA, the same bits)."""
    return apply_kv_format(x, "fp8_e8m0_b32", impl=impl)


def quantize_linear_inputs(module: torch.nn.Module) -> torch.nn.Module:
    """Make a linear (or any module whose first input feeds an FP8 GEMM) round its input through
    `act_quant` first: a build-time transformation of the model, not a flag in its forward."""
    module.register_forward_pre_hook(lambda _m, args: (act_quant(args[0]), *args[1:]))
    return module
