"""Torch reference of the mHC collapse: the sublayer's input is a weighted sum of the streams.

    y[t, d] = sum_j pre[t, j] X[t, j, d]          (fp32, rounded once to X's dtype)
"""

import torch


def hc_collapse_reference(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    return (pre.float().unsqueeze(-1) * streams).sum(dim=1).to(streams.dtype)
