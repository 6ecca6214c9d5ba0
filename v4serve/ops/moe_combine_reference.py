"""Torch reference of the MoE combine: each token sums its k weighted expert outputs.

    out[t] = round(sum_i w[t, i] y[pos[t k + i]]) (+ add[t], rounded again)

y [P, D] holds the expert outputs in sorted pick order (moe_sort's `pos` maps pick t k + i to its
row; None: y is already in pick order); the products and the sum are fp32; `add` (the shared
expert) is added in out's dtype.
"""

import torch


def moe_combine_reference(y: torch.Tensor, pos: torch.Tensor | None, weights: torch.Tensor,
                          add: torch.Tensor | None = None) -> torch.Tensor:
    t, k = weights.shape
    picks = (y.float() if pos is None else y.float()[pos]) * weights.reshape(-1, 1).float()
    out = picks.view(t, k, y.shape[1]).sum(dim=1).to(y.dtype)
    return out if add is None else out + add
