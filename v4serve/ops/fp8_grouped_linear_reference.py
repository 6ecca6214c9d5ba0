"""Torch reference of the grouped FP8 projection (the attention's `o_a_proj`, official `wo_a`).

    x      [T, G, I]                      one row of I channels per token and group
    weight float8_e4m3fn [G * R, I]       group g owns rows g*R .. (g+1)*R - 1
    scale  float32 [ceil(G*R / bn), ceil(I / bk)]
    W[n, i] = e4m3(weight[n, i]) * scale[n // bn, i // bk]
    z[t, g, r] = sum_i x[t, g, i] * W[g*R + r, i]          -> [T, G, R]

Weight-only numerics: the weight dequantized on the fly in fp32, x widened to fp32, the products
summed in fp32 and rounded to x.dtype once. With power-of-two scales every W value is exact in bf16,
so this is the bf16 einsum over the weight dequantized at load up to the order of the fp32 sums.
"""

import torch

from v4serve.ops.weight_formats import dequantize_fp8_blocks


def fp8_grouped_linear_reference(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                                 block: tuple[int, int]) -> torch.Tensor:
    t, g, i = x.shape
    w = dequantize_fp8_blocks(weight, scale, block).view(g, -1, i)
    return torch.einsum("tgi,gri->tgr", x.float(), w).to(x.dtype)
