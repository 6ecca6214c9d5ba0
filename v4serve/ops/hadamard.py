"""Normalised Walsh-Hadamard transform of the last dim: public entry point (math in
hadamard_reference.py, kernel in hadamard_triton.py). The index query's and the index key's
rotations at decode run fused into their neighbours' kernels (`rms_norm_rope(..., hadamard=True)`,
`compress_decode(..., hadamard=True)`); this op serves the rest (prefill's keys)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.hadamard_reference import check_hadamard_dim, hadamard_reference
from v4serve.ops.hadamard_triton import hadamard_triton


def hadamard(x: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    """H x / sqrt(d) over the last dim d (a power of two), fp32 math, returned in x.dtype."""
    check_hadamard_dim(x.shape[-1])
    if use_triton(impl, x):
        return hadamard_triton(x)
    return hadamard_reference(x)
