"""Torch reference of the MoE pick sort: a token's k picks regrouped by expert for the grouped matmuls.

Picks are numbered p = t * k + i (token t, slot i). A stable sort by expert gives the sorted order;
from it:

    rows[s] = order[s] // k            token of the s-th sorted pick (the first matmul gathers it)
    ends[e] = #{p : experts[p] <= e}   cumulative group ends, int32
    pos[p]  = s with order[s] = p      where pick p landed (the combine gathers it back)
"""

import torch


def moe_sort_reference(experts: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    k = experts.shape[1]
    flat = experts.flatten()
    order = torch.argsort(flat, stable=True)
    sizes = torch.zeros(n_experts, dtype=torch.int32, device=experts.device)
    sizes.scatter_add_(0, flat.int(), torch.ones_like(flat, dtype=torch.int32))
    pos = torch.empty_like(order)
    pos[order] = torch.arange(order.shape[0], device=experts.device)
    return order // k, sizes.cumsum(0, dtype=torch.int32), pos
