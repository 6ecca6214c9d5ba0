"""RMSNorm + interleaved partial RoPE: public entry point (math in norm_rope_reference.py, kernel in
norm_rope_triton.py). Every norm of the model and every rotation (q, kv, compressed rows, index
q, the output's inverse rotation) goes through `rms_norm_rope`."""

from __future__ import annotations

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.norm_rope_reference import rms_norm_rope_reference
from v4serve.ops.norm_rope_triton import rms_norm_rope_triton


def rms_norm_rope(
    x: torch.Tensor, eps: float | None = None, weight: torch.Tensor | None = None,
    cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, inverse: bool = False, impl: str = "auto",
) -> torch.Tensor:
    """RMS-normalise the last dim of x [T, D] or [T, H, D] (eps None: no norm; weight [D] optional),
    then rotate its last 2R channels by the per-token angles cos, sin [T, R] fp32 (None: no
    rotation; `inverse` negates the angles). Returns x's shape and dtype."""
    D = x.shape[-1]
    if weight is not None and (eps is None or weight.shape != (D,)):
        raise ValueError(f"weight must be [{D}] and come with eps, got {tuple(weight.shape)} with eps={eps}")
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin must be given together")
    if cos is not None:
        if x.dim() < 2 or cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != x.shape[0]:
            raise ValueError(f"cos and sin must be [{x.shape[0]}, R] for x {tuple(x.shape)}, got "
                             f"{tuple(cos.shape)} and {tuple(sin.shape)}")
        if 2 * cos.shape[1] > D or (D - 2 * cos.shape[1]) % 2:
            raise ValueError(f"rope_dim {2 * cos.shape[1]} must be even-aligned within D = {D}")
    if use_triton(impl, x):
        return rms_norm_rope_triton(x, eps, weight, cos, sin, inverse)
    return rms_norm_rope_reference(x, eps, weight, cos, sin, inverse)
