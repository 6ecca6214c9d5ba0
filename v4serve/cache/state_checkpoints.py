"""Compressor states after each token of a speculative verify step, and the commit of the accepted
prefix's state: the device-side rollback of verify steps (no host work, CUDA-graph safe).

A verify step feeds each sequence's last token and its k drafts, group by group (group j: every
sequence's token at position start + j; `PagedKVCache.build_verify_batch`), through every
compressor, which folds them into the sequence's state in order. Before group j >= 1 overwrites
part of a state, the compressor journals that part (an undo log of the step's slots):

    saved[state][j - 1, b, x] = state[slot_b, x]  (after group j - 1)    x in written[state][j - 1, b]

x ranges over a state row's sub-rows (an overlap compressor's 2r rows of kv and score; an online
state's max, sum and acc rows are one sub-row each, all rewritten by every group). Once the target
has scored the drafts, sequence b keeps tokens 0..a_b (a_b accepted drafts), so its state must be
the one after group a_b: the commit undoes groups k .. a_b + 1, last first (nothing when all
drafts are accepted):

    state[slot_b, x] = saved[state][j, b, x]        j = k - 1 down to a_b, x in written[state][j, b]

Everything else a rejected token wrote needs no undo: its window row lies past the last kept
position in a ring of W + k rows (read by no later token before it is rewritten), and a compressed
row or index key it completed is visible only to positions >= its own, which a later step computes
(and so rewrites) first (`cache/rollback.py`).

Layout: a state object's tensors are views of one allocation `stacked` [n, slots, ...] (n = 2:
kv, score; n = 3: max, sum, acc), read here as rows [n * slots, ...] (row t * slots + slot); the
journal is saved [groups, max_rows * n, ...] (entry b * n + t, the state's row layout, so a sub-row
keeps its offset) and written [groups, max_rows] int32 bit masks. The verify step's compressor
kernel writes them itself (`ops/compress_verify.py`; `save` is a whole-state equivalent), and a
commit is one launch for every state object (`ops/state_commit.py`). Memory: (k + 1) x max_rows
copies of a slot's compressor and indexer states (`checkpoint_bytes`; the last group's is unused).
"""

from __future__ import annotations

import torch

from v4serve.ops.state_commit import StateCommit


def checkpoint_bytes(state_bytes_per_slot: int, states: int, groups: int, max_rows: int) -> int:
    """Bytes of the journals: `groups` copies of each of `max_rows` slots' state rows, and an int32
    mask per group, row and state object (`states` of them)."""
    return (state_bytes_per_slot + 4 * states) * groups * max_rows


class StateCheckpoints:
    """Saved states for verify steps of up to `max_rows` sequences and `groups` tokens each, for
    `states` (the cache's CompressorState / OnlinePoolState objects). A step calls `begin(slots)`,
    then the compressors journal what each group overwrites (`journal`, or `save(state, j)`),
    then `commit(accepted)`."""

    def __init__(self, states, groups: int, max_rows: int):
        if groups < 1 or max_rows < 1:
            raise ValueError(f"groups and max_rows must be >= 1, got {groups}, {max_rows}")
        self.groups, self.max_rows = groups, max_rows
        self._states = list(states)
        self._saved: dict[int, torch.Tensor] = {}
        self._written: dict[int, torch.Tensor] = {}
        widths = set()
        for state in self._states:
            n, _, *row = state.stacked.shape
            widths.add(n)
            device = state.stacked.device
            self._saved[id(state)] = torch.empty(groups, max_rows * n, *row, dtype=state.stacked.dtype, device=device)
            self._written[id(state)] = torch.zeros(groups, max_rows, dtype=torch.int32, device=device)
        device = self._states[0].stacked.device if self._states else torch.device("cpu")
        self._parts = {n: torch.arange(n, device=device) for n in widths}  # tensor index t within a state
        self._size = 0
        self._slots: torch.Tensor | None = None  # the step's slots [S]
        self._commit = StateCommit([s.stacked for s in self._states], [self._saved[id(s)] for s in self._states],
                                   [self._written[id(s)] for s in self._states])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._saved.values(), *self._written.values()))

    def begin(self, slots: torch.Tensor) -> None:
        """Start a step over the sequences in cache slots `slots` [S] (device tensor)."""
        self._size = slots.shape[0]
        self._slots = slots

    def journal(self, state) -> tuple[torch.Tensor, torch.Tensor]:
        """The undo journal of `state`: saved [groups, max_rows * n, ...] (entry b * n + t) and
        written [groups, max_rows] int32, for a kernel that writes it itself
        (`ops/compress_verify.py`) in place of `save`."""
        return self._saved[id(state)], self._written[id(state)]

    def save(self, state, group: int) -> None:
        """After group `group` (before group + 1 runs): journal the step's sequences' whole rows of
        `state` (every sub-row marked written; what the kernel journals is the part group + 1
        overwrites)."""
        n, total, *row = state.stacked.shape
        rows = (self._slots[:, None] + self._parts[n][None, :] * total).reshape(-1)  # row t * slots + slot
        torch.index_select(state.stacked.flatten(0, 1), 0, rows, out=self._saved[id(state)][group, :rows.shape[0]])
        sub = state.stacked[0, 0].numel() // row[-1]
        self._written[id(state)][group, :self._size] = (1 << sub) - 1

    def commit(self, accepted: torch.Tensor) -> None:
        """Give each sequence b its states after group accepted[b] (int64 [S] on the device: the
        drafts it accepted, 0..groups - 1)."""
        if accepted.shape[0] != self._size:
            raise ValueError(f"commit of {accepted.shape[0]} sequences after a step of {self._size}")
        self._commit(self._slots, accepted.clamp(0, self.groups - 1))
