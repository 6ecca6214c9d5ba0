"""The commit of a speculative verify step's compressor states (the device-side rollback,
`cache/state_checkpoints.py`): the torch reference.

For every state object i (its tensors stacked [n_i, slots, *row_i]) and its checkpoints
saved_i [groups, max_rows * n_i, *row_i] (row b * n_i + t: tensor t of the step's sequence b after
a group), sequence b, which kept `accepted[b]` drafts, gets the states after group accepted[b]:

    stacked_i[t, slots[b]] = saved_i[accepted[b], b * n_i + t]        t < n_i, b < S
"""

from __future__ import annotations

import torch


def state_commit_reference(stacked: list[torch.Tensor], saved: list[torch.Tensor], slots: torch.Tensor,
                           accepted: torch.Tensor) -> None:
    b = torch.arange(slots.shape[0], device=slots.device)
    for state, copies in zip(stacked, saved):
        n = state.shape[0]
        for t in range(n):
            state[t, slots] = copies[accepted, b * n + t]
