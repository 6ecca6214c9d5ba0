"""What a step's shape decides, once per step, for every layer (FlashInfer's plan / run).

The model builds one `StepPlan` per forward (`plan_step`); each layer reads it instead of
deciding from the batch again:

* `rope`: every rotary angle the step needs (`rope.StepRope`);
* `attn_rows`: how the step's T queries enter sparse attention. A decode step of up to
  `DECODE_ROWS_MAX_TOKENS` sequences goes in as [T, 1] (one query per row: the kernels' decode
  path, split-K for one sequence, the two-pass kernels for more: 2-3x faster per call than one
  [1, T] prefill call up to 32 sequences on the H200; at 64 the prefill kernel is faster,
  docs/performance.md item 16); anything else as one [1, T] prefill;
* `unpack_bounds`: per compress ratio (0: window rows only), a bound on the distinct pool rows a
  prefill step's attention columns name: each chunk's ring rows before it (fewer than the window)
  and its own staging rows, plus the compressed rows its last token sees (end // ratio). Prefill
  over packed rows unpacks the rows it reads into a pool of that size (ops/kv_compact.py) without
  asking the device how many there are. Decode-addressed steps (no chunks on the host) have none:
  the op then bounds it from the shapes.
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
    unpack_bounds: tuple[tuple[int, int], ...] = ()  # (ratio, bound on the rows a layer of that ratio reads)
    engram_rows: tuple[torch.Tensor, ...] = ()  # per Engram table: int64 [T, R]

    def unpack_bound(self, ratio: int) -> int | None:
        """The most distinct pool rows a layer of compress ratio `ratio` reads this step (None: unknown)."""
        return dict(self.unpack_bounds).get(ratio)

    @property
    def decode_kernels(self) -> bool:
        """Attention runs the decode kernels (one query per row)."""
        return self.attn_rows[1] == 1


def plan_step(batch: ForwardBatch, rope: RopeTables, engram_rows: tuple[torch.Tensor, ...] = ()) -> StepPlan:
    t = batch.num_tokens
    rows = (t, 1) if batch.is_decode and t <= DECODE_ROWS_MAX_TOKENS else (1, t)
    return StepPlan(rope.at(batch.positions), rows, unpack_bounds(batch), engram_rows)


def unpack_bounds(batch: ForwardBatch) -> tuple[tuple[int, int], ...]:
    """((ratio, bound), ...) for ratio 0 and every compressed ratio of the batch (see above)."""
    if batch.is_decode or not batch.chunks:
        return ()
    width = batch.window_columns.shape[1]
    window_rows = sum(min(width, c.start) + c.length for c in batch.chunks)
    return ((0, window_rows),) + tuple((r, window_rows + sum(c.end // r for c in batch.chunks))
                                       for r in sorted(batch.compressed_rows))
