"""RMSNorm with a weight: every named norm of the model.

It computes in float32 and returns the input dtype, as the reference does; the math and the
kernel are the op `v4serve.ops.norm_rope.rms_norm_rope` (which also serves the weightless per-head
q norm and can rotate the result).
"""

from __future__ import annotations

import torch
from torch import nn

from v4serve.model.kernels import UsesKernels
from v4serve.ops.norm_rope import rms_norm_rope


class RMSNorm(UsesKernels, nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm_rope(x, self.eps, self.weight, impl=self.impl)
