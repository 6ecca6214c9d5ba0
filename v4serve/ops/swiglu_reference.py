"""Torch reference of the clamped SwiGLU of DeepSeek-V4's experts (L = swiglu_limit):

    h = silu(min(gate, L)) * clamp(up, -L, L)        in the inputs' dtype (torch rounds each op)
"""

import torch
import torch.nn.functional as F


def clamped_swiglu_reference(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)
