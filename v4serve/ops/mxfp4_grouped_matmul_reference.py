"""Torch reference of the MXFP4 (W4A16) MoE grouped matmul.

    y[m] = x[rows[m]] @ W[g(m)]^T,   g(m) = the group e with ends[e-1] <= m < ends[e]
    W[e, n, k] = e2m1(nibble k of weight[e, n]) * 2^(scale[e, n, k // 32] - 127)

weight uint8 [E, N, K/2] (element 2j in the low nibble), scale uint8 ue8m0 [E, N, K/32]
(weight_formats.py). Each group's weights are dequantized exactly (fp32) and multiplied in fp32;
y is rounded to x.dtype once. Only the groups that have picks are dequantized (their sizes are
read on the host: this is the CPU / test path, not a graph-captured one).
"""

import torch

from v4serve.ops.weight_formats import dequantize_mxfp4


def mxfp4_grouped_matmul_reference(picks: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                                   ends: torch.Tensor) -> torch.Tensor:
    """y [M, N] for the gathered rows picks [M, K] = x[rows], sorted by group."""
    y = torch.zeros(picks.shape[0], weight.shape[1], dtype=torch.float32, device=picks.device)
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            y[start:end] = picks[start:end].float() @ dequantize_mxfp4(weight[e], scale[e]).T
        start = end
    return y.to(picks.dtype)
