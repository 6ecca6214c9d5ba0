"""Torch reference of the mHC coefficients of one sublayer (see model/mhc.py for the wiring).

For each token, with n streams, mixes m = (fn @ flatten(X)) * row_scale ([T, (2+n)n], fp32):

    pre_j   = sigmoid(scale0 m[j] + base[j]) + eps
    post_j  = 2 sigmoid(scale1 m[n+j] + base[n+j])
    C       = softmax_k(scale2 m[2n + jn + k] + base[2n + jn + k]) + eps     (row softmax)
    C[:, k] /= sum_j C[j, k] + eps                                           (columns)
    (iters - 1) times: rows /= (row sum + eps), then columns /= (column sum + eps)   (Sinkhorn)
"""

import torch


def hc_coefficients_reference(
    mixes: torch.Tensor, row_scale: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, n: int, iters: int,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    m = mixes.float() * row_scale.float()[:, None]
    pre_m, post_m, comb_m = m.split([n, n, n * n], dim=-1)
    pre_b, post_b, comb_b = base.split([n, n, n * n])
    pre = torch.sigmoid(pre_m * scale[0] + pre_b) + eps
    post = 2 * torch.sigmoid(post_m * scale[1] + post_b)
    comb = torch.softmax(comb_m.unflatten(-1, (n, n)) * scale[2] + comb_b.view(n, n), dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb
