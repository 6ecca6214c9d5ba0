"""The commit of a verify step's compressor states, every state object in one call (one launch on
the Triton path instead of a gather and a scatter per state object; only what later groups
overwrote moves): public entry point (math in state_commit_reference.py, kernel in
state_commit_triton.py)."""

from __future__ import annotations

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.state_commit_reference import state_commit_reference
from v4serve.ops.state_commit_triton import commit_table, state_commit_triton


class StateCommit:
    """Commits for fixed `stacked` states [n_i, slots, *row_i] and their undo journals: `saved`
    [groups, max_rows * n_i, *row_i] (fp32, contiguous) and `written` [groups, max_rows] int32 (the
    kernel's address table is built here, once)."""

    def __init__(self, stacked: list[torch.Tensor], saved: list[torch.Tensor], written: list[torch.Tensor],
                 impl: str = "auto"):
        for state, copies, masks in zip(stacked, saved, written, strict=True):
            if (state.dtype != torch.float32 or copies.dtype != torch.float32 or not state.is_contiguous()
                    or not copies.is_contiguous() or copies.shape[2:] != state.shape[2:]
                    or copies.shape[1] % state.shape[0]):
                raise ValueError(f"states [n, slots, *row] and checkpoints [groups, rows * n, *row] must be contiguous "
                                 f"fp32, got {tuple(state.shape)} {state.dtype} and {tuple(copies.shape)} {copies.dtype}")
            if (masks.dtype != torch.int32 or not masks.is_contiguous()
                    or tuple(masks.shape) != (copies.shape[0], copies.shape[1] // state.shape[0])):
                raise ValueError(f"written must be contiguous int32 [{copies.shape[0]}, "
                                 f"{copies.shape[1] // state.shape[0]}], got {tuple(masks.shape)} {masks.dtype}")
        self.stacked, self.saved, self.written = list(stacked), list(saved), list(written)
        self.triton = bool(self.stacked) and use_triton(impl, *self.stacked, *self.saved)
        self._table = commit_table(self.stacked, self.saved, self.written) if self.triton else None

    def __call__(self, slots: torch.Tensor, accepted: torch.Tensor) -> None:
        """Sequence b's states (in slots[b]) back to those after group accepted[b], from the live
        states after the last group and the undo journals (state_commit_reference.py)."""
        if self.triton:
            state_commit_triton(self._table, slots, accepted)
        else:
            state_commit_reference(self.stacked, self.saved, self.written, slots, accepted)
