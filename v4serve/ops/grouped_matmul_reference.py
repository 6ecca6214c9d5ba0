"""Torch reference of the MoE grouped matmul.

    y[m] = x[rows[m]] @ weight[g(m)]^T,   g(m) = the group e with ends[e-1] <= m < ends[e]

Picks are sorted by group (expert); `ends` are the groups' cumulative ends (int32, on the device).
"""

import torch


def grouped_matmul_reference(picks: torch.Tensor, weight: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """y[m] = picks[m] @ weight[g(m)]^T for the gathered rows picks [M, K] = x[rows]."""
    # torch._grouped_mm takes the group ends as offsets; its CPU path needs no host synchronisation either.
    return torch._grouped_mm(picks, weight.transpose(1, 2), offs=ends)
