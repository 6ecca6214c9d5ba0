"""What a step's shape decides, once per step, for every layer (FlashInfer's plan / run).

The model builds one `StepPlan` per forward (`plan_step`); each layer reads it instead of
deciding from the batch again:

* `rope`: every rotary angle the step needs (`rope.StepRope`);
* `attn_rows`: how the step's T queries enter sparse attention. A decode step of up to
  `DECODE_ROWS_MAX_TOKENS` sequences goes in as [T, 1] (one query per row: the kernels' decode
  path, split-K for one sequence, the two-pass kernels for more: 2-3x faster per call than one
  [1, T] prefill call up to 32 sequences on the H200; at 64 the prefill kernel is faster,
  docs/performance.md item 16); anything else as one [1, T] prefill;
* `engram_rows`: per Engram table (V4.1), the table rows of the step's tokens, hashed once
  (`engram_hash.NgramHasher`); the layer whose plan names the table reads them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from v4serve.cache import ForwardBatch
from v4serve.model.rope import RopeTables, StepRope

DECODE_ROWS_MAX_TOKENS = 32


@dataclass(frozen=True)
class StepPlan:
    rope: StepRope
    attn_rows: tuple[int, int]  # (B, M) of the sparse-attention call's queries
    engram_rows: tuple[torch.Tensor, ...] = ()  # per Engram table: int64 [T, R]

    @property
    def decode_kernels(self) -> bool:
        """Attention runs the decode kernels (one query per row)."""
        return self.attn_rows[1] == 1


def plan_step(batch: ForwardBatch, rope: RopeTables, engram_rows: tuple[torch.Tensor, ...] = ()) -> StepPlan:
    t = batch.num_tokens
    rows = (t, 1) if batch.is_decode and t <= DECODE_ROWS_MAX_TOKENS else (1, t)
    return StepPlan(rope.at(batch.positions), rows, engram_rows)
