"""Torch reference of the mHC head's collapse weights (V4: `hc_head_fn [n, nD]`, `hc_head_base [n]`,
`hc_head_scale [1]`; no post, no comb). For each token with flattened final streams x [nD]:

    m      = hc_head_fn @ x                               (fp32)
    pre_j  = sigmoid(m[j] * (rsqrt(mean(x^2) + rms_eps) * scale) + base[j]) + hc_eps
"""

import torch

from v4serve.ops.hc_mix_reference import hc_mix_reference


def hc_head_pre_reference(x: torch.Tensor, fn: torch.Tensor, rms_eps: float, base: torch.Tensor,
                          scale: torch.Tensor, hc_eps: float) -> torch.Tensor:
    mixes, row_scale = hc_mix_reference(x, fn, rms_eps)
    return torch.sigmoid(mixes * (row_scale[:, None] * scale.float()) + base.float()) + hc_eps
