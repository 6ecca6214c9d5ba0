"""Compressor states after each token of a speculative verify step, and the commit of the accepted
prefix's state: the device-side rollback of verify steps (no host work, CUDA-graph safe).

A verify step feeds each sequence's last token and its k drafts, group by group (group j: every
sequence's token at position start + j; `PagedKVCache.build_verify_batch`), through every
compressor, which folds them into the sequence's state in order. After group j the compressor
saves the states of the step's slots:

    saved[state][j, b] = state[slot_b]                    j = 0..k, b < S (the step's rows)

Once the target has scored the drafts, sequence b keeps tokens 0..a_b (a_b accepted drafts), so its
state must be the one after group a_b:

    state[slot_b] = saved[state][a_b, b]

Everything else a rejected token wrote needs no undo: its window row lies past the last kept
position in a ring of W + k rows (read by no later token before it is rewritten), and a compressed
row or index key it completed is visible only to positions >= its own, which a later step computes
(and so rewrites) first (`cache/rollback.py`).

Layout: a state object's tensors are views of one allocation `stacked` [n, slots, ...] (n = 2:
kv, score; n = 3: max, sum, acc), read here as rows [n * slots, ...] (row t * slots + slot); the
saved copies are [groups, max_rows * n, ...], row b * n + t. The verify step's compressor kernel
writes them itself (`ops/compress_verify.py`; `save` is the one-gather-per-state equivalent), and a
commit is one launch for every state object (`ops/state_commit.py`). Memory: (k + 1) x max_rows
copies of a slot's compressor and indexer states (`checkpoint_bytes`).
"""

from __future__ import annotations

import torch

from v4serve.ops.state_commit import StateCommit


def checkpoint_bytes(state_bytes_per_slot: int, groups: int, max_rows: int) -> int:
    """Bytes of the saved states: `groups` copies of each of `max_rows` slots' state rows."""
    return state_bytes_per_slot * groups * max_rows


class StateCheckpoints:
    """Saved states for verify steps of up to `max_rows` sequences and `groups` tokens each, for
    `states` (the cache's CompressorState / OnlinePoolState objects). A step calls `begin(slots)`,
    then the compressors write the states after each group j (`saved_rows`, or `save(state, j)`),
    then `commit(accepted)`."""

    def __init__(self, states, groups: int, max_rows: int):
        if groups < 1 or max_rows < 1:
            raise ValueError(f"groups and max_rows must be >= 1, got {groups}, {max_rows}")
        self.groups, self.max_rows = groups, max_rows
        self._states = list(states)
        self._saved: dict[int, torch.Tensor] = {}
        widths = set()
        for state in self._states:
            n, _, *row = state.stacked.shape
            widths.add(n)
            self._saved[id(state)] = torch.empty(groups, max_rows * n, *row, dtype=state.stacked.dtype,
                                                 device=state.stacked.device)
        device = self._states[0].stacked.device if self._states else torch.device("cpu")
        self._parts = {n: torch.arange(n, device=device) for n in widths}  # tensor index t within a state
        self._size = 0
        self._slots: torch.Tensor | None = None  # the step's slots [S]
        self._commit = StateCommit([s.stacked for s in self._states], [self._saved[id(s)] for s in self._states])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._saved.values())

    def begin(self, slots: torch.Tensor) -> None:
        """Start a step over the sequences in cache slots `slots` [S] (device tensor)."""
        self._size = slots.shape[0]
        self._slots = slots

    def saved_rows(self, state) -> torch.Tensor:
        """The saved copies of `state` [groups, max_rows * n, ...] (row b * n + t after group j at
        [j]), for a kernel that writes them itself (`ops/compress_verify.py`) in place of `save`."""
        return self._saved[id(state)]

    def save(self, state, group: int) -> None:
        """After group `group`: keep the step's sequences' rows of `state`."""
        n, total = state.stacked.shape[:2]
        rows = (self._slots[:, None] + self._parts[n][None, :] * total).reshape(-1)  # row t * slots + slot
        torch.index_select(state.stacked.flatten(0, 1), 0, rows, out=self._saved[id(state)][group, :rows.shape[0]])

    def commit(self, accepted: torch.Tensor) -> None:
        """Give each sequence b its states after group accepted[b] (int64 [S] on the device: the
        drafts it accepted, 0..groups - 1)."""
        if accepted.shape[0] != self._size:
            raise ValueError(f"commit of {accepted.shape[0]} sequences after a step of {self._size}")
        self._commit(self._slots, accepted.clamp(0, self.groups - 1))
