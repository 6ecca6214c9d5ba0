"""Clamped SwiGLU: public entry point (math in swiglu_reference.py, kernel in swiglu_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.swiglu_reference import clamped_swiglu_reference
from v4serve.ops.swiglu_triton import clamped_swiglu_triton


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float, impl="auto") -> torch.Tensor:
    """silu(min(gate, limit)) * clamp(up, -limit, limit) [M, I] in gate's dtype; gate, up [M, I] of
    one dtype, any row strides (e.g. the two halves of a fused gate_up projection)."""
    if gate.dim() != 2 or gate.shape != up.shape or gate.dtype != up.dtype:
        raise ValueError(f"gate and up must be [M, I] of one dtype, got {gate.dtype} {tuple(gate.shape)} and "
                         f"{up.dtype} {tuple(up.shape)}")
    if use_triton(impl, gate, up):
        return clamped_swiglu_triton(gate, up, limit)
    return clamped_swiglu_reference(gate, up, limit)
