"""RMSNorm, weighted (every named norm of the model) and weightless (per-head q, mHC mixer input).

Both compute in float32 and return the input dtype, as the reference does; the math and the
kernel are the op `v4serve.ops.norm_rope.rms_norm_rope` (which can also rotate the result).
"""

from __future__ import annotations

import torch
from torch import nn

from v4serve.ops.norm_rope import rms_norm_rope


def rms_normalize(x: torch.Tensor, eps: float, impl: str = "auto") -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim, in float32, returned in x.dtype."""
    return rms_norm_rope(x, eps, impl=impl)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, impl: str = "auto") -> torch.Tensor:
        return rms_norm_rope(x, self.eps, self.weight, impl=impl)
