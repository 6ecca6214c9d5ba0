"""Torch reference of the mHC mixer input: the un-normalised mixes and the per-token RMS factor.

For each token with flattened streams x [K] (K = n * D) and a sublayer's fn [M, K] (fp32):

    mixes[m]  = sum_k fn[m, k] x[k]                    (fp32)
    row_scale = rsqrt(mean_k(x[k]^2) + eps)            (fp32)

The RMS factor is a per-token scalar, so it commutes with fn: the coefficients apply it later.
"""

import torch
import torch.nn.functional as F


def hc_mix_reference(x: torch.Tensor, fn: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    flat = x.float()
    row_scale = torch.rsqrt(flat.square().mean(-1) + eps)
    return F.linear(flat, fn.float()), row_scale
