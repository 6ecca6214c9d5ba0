"""The commit of a verify step's compressor states, every state object in one call (one launch on
the Triton path instead of a gather and a scatter per state object): public entry point (math in
state_commit_reference.py, kernel in state_commit_triton.py)."""

from __future__ import annotations

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.state_commit_reference import state_commit_reference
from v4serve.ops.state_commit_triton import commit_table, state_commit_triton


class StateCommit:
    """Commits for fixed `stacked` states [n_i, slots, *row_i] and their checkpoints `saved`
    [groups, max_rows * n_i, *row_i] (fp32, contiguous; the kernel's address table is built here,
    once)."""

    def __init__(self, stacked: list[torch.Tensor], saved: list[torch.Tensor], impl: str = "auto"):
        for state, copies in zip(stacked, saved):
            if (state.dtype != torch.float32 or copies.dtype != torch.float32 or not state.is_contiguous()
                    or not copies.is_contiguous() or copies.shape[2:] != state.shape[2:]
                    or copies.shape[1] % state.shape[0]):
                raise ValueError(f"states [n, slots, *row] and checkpoints [groups, rows * n, *row] must be contiguous "
                                 f"fp32, got {tuple(state.shape)} {state.dtype} and {tuple(copies.shape)} {copies.dtype}")
        self.stacked, self.saved = list(stacked), list(saved)
        self.triton = bool(self.stacked) and use_triton(impl, *self.stacked, *self.saved)
        self._table = commit_table(self.stacked, self.saved) if self.triton else None

    def __call__(self, slots: torch.Tensor, accepted: torch.Tensor) -> None:
        """stacked_i[t, slots[b]] = saved_i[accepted[b], b * n_i + t] for every state i, tensor t, row b."""
        if self.triton:
            state_commit_triton(self._table, slots, accepted)
        else:
            state_commit_reference(self.stacked, self.saved, slots, accepted)
