"""RMSNorm and interleaved partial RoPE of DeepSeek-V4, as one op: the torch reference.

    y = x / sqrt(mean(x^2) + eps) [* weight]           in fp32, rounded to x.dtype
    on the last rope_dim = 2 * R channels, pair i = (y[2i], y[2i+1]) rotates by the angle whose
    cos and sin are given per token (cos, sin [T, R] fp32; `inverse` negates the angle):
        y'[2i]   = y[2i] cos - y[2i+1] sin
        y'[2i+1] = y[2i+1] cos + y[2i] sin              in fp32, rounded to x.dtype

Either half may be skipped: eps None = no norm, cos None = no rotation. x is [T, D] or
[T, H, D] (the angle of token t applies to each of its heads). The rounding points are those of
the model's reference (and transformers'): the normalised vector is rounded before the rotation.
"""

from __future__ import annotations

import torch


def rms_norm_reference(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dim [* weight], in fp32, returned in x.dtype."""
    xf = x.float()
    normed = xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        normed = weight.float() * normed
    return normed.to(x.dtype)


def rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last 2 * cos.shape[-1] channels of x [T, ..., D] by the per-token cos, sin [T, R]."""
    rope_dim = 2 * cos.shape[-1]
    if inverse:
        sin = -sin
    while cos.dim() < x.dim():  # [T, R] -> [T, 1, ..., R]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rope = x[..., -rope_dim:].float().unflatten(-1, (-1, 2))
    even, odd = rope[..., 0], rope[..., 1]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rope_dim], rotated.to(x.dtype)), dim=-1)


def rms_norm_rope_reference(
    x: torch.Tensor, eps: float | None = None, weight: torch.Tensor | None = None,
    cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, inverse: bool = False,
) -> torch.Tensor:
    if eps is not None:
        x = rms_norm_reference(x, eps, weight)
    if cos is not None:
        x = rope_reference(x, cos, sin, inverse)
    return x
