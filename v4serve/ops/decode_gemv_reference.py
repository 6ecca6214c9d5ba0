"""Torch reference of the decode GEMV: y = x W^T for a few rows of x.

    y[t, n] = sum_k x[t, k] W[n, k]      products and sums in fp32, y rounded once to x's dtype

(x bf16 [T, K], W bf16 [N, K]: what a bf16 GEMM with fp32 accumulation computes, up to the order of
its sums). The model's router logits (V4-Flash: N 256 experts, K 4096) at decode sizes.
"""

import torch
import torch.nn.functional as F


def decode_gemv_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.linear(x.float(), weight.float()).to(x.dtype)
