"""Torch reference of the FP8 block-scaled linear and of the official activation quantization.

Weight (see weight_formats.py): weight e4m3 [N, K], scale float32 [ceil(N/bn), ceil(K/bk)],
W[n, k] = weight[n, k] * scale[n // bn, k // bk].

Weight-only numerics (act_block None; the CPU path):   y = x @ W^T
Official numerics (act_block = 128 for V4, 32 for V4.1): y = Q(x) @ W^T, with Q the activation
quantization of the reference `act_quant(x, act_block, scale_fmt="ue8m0")`: per row and per group
g of act_block consecutive channels (the last group may be partial),

    s[m, g]  = 2^ceil(log2(max(amax_g |x[m, :]|, 1e-4) * fp32(1/448)))   (ue8m0, a power of two)
    q[m, k]  = e4m3_rne(clamp(x[m, k] / s[m, k // act_block], -448, 448))
    Q(x)     = q * s

(the same rounding as the V4 KV quantizer, `kv_quant_reference.ue8m0_scale`: the quotient by 448
and the product with fp32(1/448) give the same ceil for every fp32 amax, checked exhaustively over
two binades; the V4.1 golden `fp8_e8m0_b32` table pins it bit for bit). The reference fp8_gemm
sums the block products `dot(q_blk, w_blk) * s_a * s_w` in fp32; with power-of-two scales every
product is exact, so it is the same sum as Q(x) @ W^T up to the fp32 summation order.

Both are computed in fp32 (x and W exact in fp32) and rounded to x.dtype once.
"""

import torch

from v4serve.ops.kv_quant_reference import E4M3_MAX, FP8_SCALE_FLOOR, round_e4m3, ue8m0_scale
from v4serve.ops.weight_formats import dequantize_fp8_blocks


def act_quant_reference(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn [..., K], scales float32 [..., ceil(K / block)]) of x [..., K]."""
    k = x.shape[-1]
    groups = -(-k // block)
    padded = torch.zeros(*x.shape[:-1], groups * block, dtype=torch.float32, device=x.device)
    padded[..., :k] = x.float()
    padded = padded.reshape(*x.shape[:-1], groups, block)
    s = ue8m0_scale(padded.abs().amax(-1, keepdim=True), E4M3_MAX, FP8_SCALE_FLOOR)
    q = round_e4m3((padded / s).clamp(-E4M3_MAX, E4M3_MAX))
    return q.reshape(*x.shape[:-1], groups * block)[..., :k].to(torch.float8_e4m3fn), s.squeeze(-1)


def act_dequant_reference(codes: torch.Tensor, scales: torch.Tensor, block: int) -> torch.Tensor:
    """float32 Q(x) = codes * scales (exact) from act_quant_reference's output."""
    k = codes.shape[-1]
    return codes.float() * scales.repeat_interleave(block, -1)[..., :k]


def fp8_linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block=(128, 128),
                         act_block: int | None = None) -> torch.Tensor:
    """y [..., N] = A @ W^T in fp32, rounded to x.dtype once; A = x (act_block None) or Q(x)."""
    w = dequantize_fp8_blocks(weight, scale, block)
    a = x.float() if act_block is None else act_dequant_reference(*act_quant_reference(x, act_block), act_block)
    return (a @ w.T).to(x.dtype)
