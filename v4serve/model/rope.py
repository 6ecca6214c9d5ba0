"""Interleaved partial RoPE on the LAST `rope_dim` channels of a vector.

Channel pairs (x[2i], x[2i+1]) of the rope slice rotate by angle `position * inv_freq[i]`:

    y[2i]   = x[2i] cos - x[2i+1] sin
    y[2i+1] = x[2i+1] cos + x[2i] sin

Two frequency tables per model: `main` (window-only layers; plain, base `rope_theta`) and
`compress` (every layer with a compressor, its compressed rows and its indexer; base
`compress_rope_theta` with YaRN interpolation and no attention mscale). `inverse=True` rotates
by the negated angle: the attention output's rope slice is de-rotated at the query position.
"""

from __future__ import annotations

import math

import torch

from v4serve.config import ModelConfig, YarnScaling


def inverse_frequencies(rope_dim: int, base: float, yarn: YarnScaling | None) -> torch.Tensor:
    """inv_freq[i] = base^(-2i/rope_dim), i < rope_dim/2, YaRN-blended when `yarn` is given:
    channels past the high-frequency cutoff are divided by `factor`, with a linear ramp between
    the correction dims of `beta_fast` and `beta_slow` (floored / ceiled)."""
    exponents = torch.arange(0, rope_dim, 2, dtype=torch.float32) / rope_dim
    inv_freq = 1.0 / (base ** exponents)
    if yarn is None:
        return inv_freq

    def correction_dim(rotations: float) -> float:
        return rope_dim * math.log(yarn.original_max_position_embeddings / (rotations * 2 * math.pi)) / (
            2 * math.log(base)
        )

    low = max(math.floor(correction_dim(yarn.beta_fast)), 0)
    high = min(math.ceil(correction_dim(yarn.beta_slow)), rope_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(rope_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    return (inv_freq / yarn.factor) * ramp + inv_freq * (1 - ramp)


class RopeTables:
    """The model's two frequency tables; `for_layer` picks the one a layer uses."""

    def __init__(self, config: ModelConfig, device: torch.device | str | None = None):
        self.rope_dim = config.qk_rope_head_dim
        self.main = inverse_frequencies(self.rope_dim, config.rope_theta, None).to(device)
        self.compress = inverse_frequencies(self.rope_dim, config.compress_rope_theta, config.compress_yarn).to(device)

    def for_ratio(self, compress_ratio: int) -> torch.Tensor:
        return self.compress if compress_ratio > 0 else self.main

    def to(self, device: torch.device | str) -> "RopeTables":
        self.main, self.compress = self.main.to(device), self.compress.to(device)
        return self


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last `2 * len(inv_freq)` channels of x [..., D] at `positions`.

    `positions` has the shape of x's leading dims up to the token axis: [T] for x [T, D] or
    x [T, H, D] (broadcast over heads)."""
    rope_dim = 2 * inv_freq.numel()
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, rope_dim/2]
    cos, sin = angles.cos(), angles.sin()
    if inverse:
        sin = -sin
    while cos.dim() < x.dim():  # [T, r/2] -> [T, 1, ..., r/2]
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    rope = x[..., -rope_dim:].float().unflatten(-1, (-1, 2))
    even, odd = rope[..., 0], rope[..., 1]
    rotated = torch.stack((even * cos - odd * sin, odd * cos + even * sin), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rope_dim], rotated.to(x.dtype)), dim=-1)
