"""The normalised Walsh-Hadamard transform of the indexer (torch reference).

    y = H_d x / sqrt(d),   H_1 = [1],  H_2k = [[H_k, H_k], [H_k, -H_k]]      over the last dim d = 2^n

computed as n fp32 butterfly stages: stage h = 1, 2, 4, ..., d/2 views the row as blocks of 2h
channels and maps each pair (a, b) = (y[i], y[i + h]) (i in the first half of its block) to
(a + b, a - b); the result is scaled by d^-0.5 (one fp32 multiply) and rounded to x's dtype. The
order of the stages fixes the fp32 rounding; a kernel that keeps it is bit-identical to this one.
DeepSeek-V4 rotates its index queries and keys with it (d = 128) before their fp4 rounding: the
rotation cancels in q . k and spreads outliers across the channels.
"""

import torch


def check_hadamard_dim(d: int) -> None:
    if d & (d - 1) or d == 0:
        raise ValueError(f"hadamard needs a power-of-two last dim, got {d}")


def hadamard_reference(x: torch.Tensor) -> torch.Tensor:
    """Normalised Walsh-Hadamard transform of the last dim (fp32 butterflies), in x.dtype."""
    d = x.shape[-1]
    check_hadamard_dim(d)
    y = x.float().reshape(-1, d)
    h = 1
    while h < d:
        pairs = y.reshape(-1, d // (2 * h), 2, h)
        y = torch.stack([pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]], 2).reshape(-1, d)
        h *= 2
    return (y * d**-0.5).reshape(x.shape).to(x.dtype)
