"""Interleaved partial RoPE on the LAST `rope_dim` channels of a vector.

Channel pairs (x[2i], x[2i+1]) of the rope slice rotate by angle `position * inv_freq[i]`:

    y[2i]   = x[2i] cos - x[2i+1] sin
    y[2i+1] = x[2i+1] cos + x[2i] sin

Two frequency tables per model: `main` (window-only layers; plain, base `rope_theta`) and
`compress` (every layer with a compressor, its compressed rows and its indexer; base
`compress_rope_theta` with YaRN interpolation and no attention mscale). The attention output's
rope slice is de-rotated (negated angle) at the query position. The rotation itself is the op
`v4serve.ops.norm_rope.rms_norm_rope` (fused with the RMSNorm that precedes it); this module owns
the frequency tables and a step's angles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
    """The model's two frequency tables (fp32 inv_freq [rope_dim/2]); `at` gives a step's angles.

    A step needs the angles of several (table, position offset) pairs: the main and the compressed
    table at each token's position p, and the compressed table at p + 1 - r, the start of the block
    a decode token completes, for every compress ratio r. They are stacked as rows (`step_tables`
    [J, 1, rope_dim/2], `step_offsets` [J, 1] fp32), so a step computes all of them with one add,
    one multiply, one cos and one sin (`StepRope`)."""

    def __init__(self, config: ModelConfig, ratios: tuple[int, ...], device: torch.device | str | None = None):
        """`ratios`: the model's distinct compress ratios (`ModelPlan.ratios`)."""
        self.rope_dim = config.qk_rope_head_dim
        self.main = inverse_frequencies(self.rope_dim, config.rope_theta, None).to(device)
        self.compress = inverse_frequencies(self.rope_dim, config.compress_rope_theta, config.compress_yarn).to(device)
        self.block_ratios = sorted(ratios)
        tables = [self.main, self.compress] + [self.compress] * len(self.block_ratios)
        offsets = [0.0, 0.0] + [1.0 - r for r in self.block_ratios]
        self.step_tables = torch.stack(tables)[:, None, :]
        self.step_offsets = torch.tensor(offsets, dtype=torch.float32, device=device)[:, None]

    def at(self, positions: torch.Tensor) -> "StepRope":
        return StepRope(self, positions)


@dataclass(frozen=True)
class RotaryAngles:
    """One table's rotation at a step's token positions: cos, sin [T, rope_dim/2] fp32, and the
    table itself (for rows rotated at other positions, such as compressed rows)."""

    inv_freq: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


def rotary_angles(positions: torch.Tensor, inv_freq: torch.Tensor) -> RotaryAngles:
    """cos and sin of position * inv_freq[i] for positions [T]."""
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return RotaryAngles(inv_freq, angles.cos(), angles.sin())


class StepRope:
    """Every angle a step needs (`RopeTables`), computed once per forward and shared by every layer."""

    def __init__(self, tables: RopeTables, positions: torch.Tensor):
        # Positions and offsets are integers below 2^24, exact in fp32: p + (1 - r) in fp32 equals
        # the integer start position converted, so each row matches `rotary_angles` bit for bit.
        angles = (positions.to(torch.float32)[None, :] + tables.step_offsets)[:, :, None] * tables.step_tables
        cos, sin = angles.cos(), angles.sin()  # [J, T, rope_dim/2]; each row [T, rope_dim/2] contiguous
        rows = [RotaryAngles(inv_freq[0], c, s) for inv_freq, c, s in zip(tables.step_tables, cos, sin)]
        self.main, self.compress = rows[:2]
        self._block_starts = dict(zip(tables.block_ratios, rows[2:]))

    def for_ratio(self, compress_ratio: int) -> RotaryAngles:
        return self.compress if compress_ratio > 0 else self.main

    def block_starts(self, ratio: int) -> RotaryAngles:
        """Compressed-table angles at p + 1 - ratio, the start of the block a decode token at p
        completes (a CSA layer's compressor and indexer share them)."""
        return self._block_starts[ratio]
