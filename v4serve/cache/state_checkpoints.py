"""Compressor states after each token of a speculative verify step, and the commit of the accepted
prefix's state: the device-side rollback of verify steps (no host work, CUDA-graph safe).

A verify step feeds each sequence's last token and its k drafts, group by group (group j: every
sequence's token at position start + j; `PagedKVCache.build_verify_batch`), through every
compressor, which folds them into the sequence's state in order. After group j the compressor
saves the states of the step's slots:

    saved[state tensor][j, b] = tensor[slot_b]            j = 0..k, b < S (the step's rows)

Once the target has scored the drafts, sequence b keeps tokens 0..a_b (a_b accepted drafts), so its
state must be the one after group a_b:

    tensor[slot_b] = saved[tensor][a_b, b]

Everything else a rejected token wrote needs no undo: its window row lies past the last kept
position in a ring of W + k rows (read by no later token before it is rewritten), and a compressed
row or index key it completed is visible only to positions >= its own, which a later step computes
(and so rewrites) first (`cache/rollback.py`).

Memory: (k + 1) x S_max copies of every compressor and indexer state row of a slot
(`checkpoint_bytes`).
"""

from __future__ import annotations

import torch


def checkpoint_bytes(state_bytes_per_slot: int, groups: int, max_rows: int) -> int:
    """Bytes of the saved states: `groups` copies of each of `max_rows` slots' state rows."""
    return state_bytes_per_slot * groups * max_rows


class StateCheckpoints:
    """Saved states for verify steps of up to `max_rows` sequences and `groups` tokens each, for the
    state tensors of `states` (the cache's CompressorState / OnlinePoolState objects)."""

    def __init__(self, states, groups: int, max_rows: int):
        if groups < 1 or max_rows < 1:
            raise ValueError(f"groups and max_rows must be >= 1, got {groups}, {max_rows}")
        self.groups, self.max_rows = groups, max_rows
        self._saved: dict[int, torch.Tensor] = {}
        for state in states:
            for t in state.tensors():
                self._saved[id(t)] = torch.empty(groups, max_rows, *t.shape[1:], dtype=t.dtype, device=t.device)
        self._tensors = [t for state in states for t in state.tensors()]
        self._row_index = torch.arange(max_rows, device=self._tensors[0].device if self._tensors else "cpu")

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._saved.values())

    def save(self, state, group: int, slots: torch.Tensor) -> None:
        """After group `group` of a step: keep the state rows of `slots` [S] (one per sequence)."""
        n = slots.shape[0]
        for t in state.tensors():
            torch.index_select(t, 0, slots, out=self._saved[id(t)][group, :n])

    def commit(self, accepted: torch.Tensor, slots: torch.Tensor) -> None:
        """Give each sequence b (slot slots[b]) its state after group accepted[b] (int64 [S] on the
        device: the drafts it accepted, 0..groups - 1)."""
        n = slots.shape[0]
        flat = accepted.clamp(0, self.groups - 1) * self.max_rows + self._row_index[:n]
        for t in self._tensors:
            saved = self._saved[id(t)].flatten(0, 1)
            t.index_copy_(0, slots, saved.index_select(0, flat))
