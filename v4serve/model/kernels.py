"""Kernel choice, bound once when the model is built (not passed through every `forward`).

Every module that launches ops derives from `UsesKernels` and passes `self.impl` to them;
`bind_kernels(model, impl)` sets it on the whole tree: "auto" (Triton on CUDA tensors, the torch
references otherwise), "torch" or "triton".
"""

from __future__ import annotations

from torch import nn

KERNEL_CHOICES = ("auto", "torch", "triton")


class UsesKernels:
    """Mixin of modules that launch ops: `impl` is their ops' implementation."""

    impl: str = "auto"


def bind_kernels(model: nn.Module, impl: str) -> nn.Module:
    """Set `impl` on every `UsesKernels` module of `model` (itself included); returns `model`."""
    if impl not in KERNEL_CHOICES:
        raise ValueError(f"kernels must be one of {KERNEL_CHOICES}, got {impl!r}")
    for module in model.modules():
        if isinstance(module, UsesKernels):
            module.impl = impl
    return model
