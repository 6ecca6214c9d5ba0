"""The per-step object the model receives: which tokens, at which positions, and where their KV
rows live. Built by `PagedKVCache.build_batch`; the model never looks anything up elsewhere.

Window addressing. Each layer's window pool holds a ring of `W = sliding_window` rows per
sequence slot (row `slot * W + position % W`) followed by a staging area with one row per token
of the step. A step writes its fresh KV rows to staging, attends over `window_columns` (ring rows
for positions before the chunk, staging rows for positions inside it), then copies each chunk's
last W rows into the ring (`ring_src -> ring_dst`), where the next step finds them.

Decode steps (one token per sequence) skip the staging area: the token's row goes straight to
its ring slot, whose previous row is already out of the window. Speculative verify steps (k + 1
tokens per sequence, `build_verify_batch`) do too, in rings of W + k rows.

Compressed addressing. Compressed row t of a sequence with ratio r lives at pool row
`page_table[slot, t*r // W] * (W // r) + t % (W // r)`: pure arithmetic on the page table, done
for a whole slot whenever its pages change (`PagedKVCache.compressed_row_table`), so a step only
gathers its sequences' rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch


@dataclass(frozen=True)
class SequenceChunk:
    """One sequence's contiguous run of tokens in a step."""

    slot: int  # the sequence's cache row: page-table row, window ring, compressor state
    start: int  # position of the chunk's first token
    length: int
    offset: int  # index of the chunk's first token in the step's flat token list

    @property
    def end(self) -> int:
        return self.start + self.length


@dataclass
class ForwardBatch:
    token_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    chunks: tuple[SequenceChunk, ...]
    window_columns: torch.Tensor  # [T, W] int32 rows of the window pool (ring or staging), -1 = none
    staging_rows: torch.Tensor  # [T] int64 window-pool row of each token's fresh KV row
    ring_src: torch.Tensor  # [N] int64 staging rows copied to the ring after attention
    ring_dst: torch.Tensor  # [N] int64
    compressed_rows: dict[int, torch.Tensor]  # ratio -> [B, R] int32 pool row of compressed row t
    logits_indices: torch.Tensor  # [N_out] int64 tokens whose next-token logits are wanted
    token_chunk: torch.Tensor  # [T] int64 index of each token's chunk
    slots: torch.Tensor  # [B] int64 cache slot of each chunk
    # Zeroed int32 counters owned by the cache, for kernels whose last program reduces the others'
    # partials (they leave them zeroed): no allocation or memset per launch, graph-replay safe.
    tickets: torch.Tensor | None = None
    _memo: dict = field(default_factory=dict, repr=False)  # per-step values shared by the layers
    # One token per chunk, addressed on the device (`build_decode_batch`): `chunks` is empty and
    # layers take their vectorised, host-free path.
    is_decode: bool = False
    # [T] int64, decode graphs padded past their live rows: the MoE routes token t as token
    # route_rows[t] (padding rows as live rows, so they add no experts). None: each as itself.
    route_rows: torch.Tensor | None = None
    # Speculative verify steps (`PagedKVCache.build_verify_batch`): the tokens form this many
    # groups of one token per sequence (group-major), folded into the compressors group by group;
    # `checkpoints` journals the compressor sub-rows each group overwrites (a StateCheckpoints: an
    # undo log, cache/state_checkpoints.py).
    verify_groups: int = 1
    checkpoints: object | None = None
    # V4.1: what index layers publish for the layers after them in this step ("topk": [T, k] int32
    # compressed rows, -1 = none; "candidates": [T, R] bool), written and read in layer order.
    published: dict = field(default_factory=dict, repr=False)

    @property
    def num_tokens(self) -> int:
        return int(self.token_ids.shape[0])

    def _memoised(self, key: tuple, compute: Callable[[], torch.Tensor]) -> torch.Tensor:
        """compute() once per step (the batch lives one step); every layer then shares the result."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def visible_compressed(self, ratio: int) -> torch.Tensor:
        """[T] int32: compressed rows each token sees, (p + 1) // ratio (complete blocks only)."""
        next_positions = self._memoised(("next positions",), lambda: (self.positions + 1).to(torch.int32))
        return self._memoised(("visible", ratio), lambda: next_positions // ratio)

    def live_picks(self, ratio: int, k: int) -> torch.Tensor:
        """[T] int32: min(visible_compressed, k), the live entries of a token's best-first top-k
        picks among its compressed rows (the holes come last)."""
        return self._memoised(("picks", ratio, k), lambda: self.visible_compressed(ratio).clamp(max=k))

    def columns_of_all_rows(self, ratio: int) -> torch.Tensor:
        """[T, W + R] int32: the window columns, then the pool rows of every compressed row of the
        token's sequence: the columns of a layer that attends to all of its compressed rows (HCA).
        Rows past a token's `visible_compressed` are not masked: the attention takes that count
        and stops there."""
        def compute() -> torch.Tensor:
            rows_of = self.compressed_rows[ratio]
            rows = rows_of if self.is_decode else rows_of[self.token_chunk]  # decode: a chunk per token
            return torch.cat((self.window_columns, rows), dim=1)
        return self._memoised(("all rows", ratio), compute)

