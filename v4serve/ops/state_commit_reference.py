"""The commit of a speculative verify step's compressor states (the device-side rollback,
`cache/state_checkpoints.py`): the torch reference.

For every state object i (its tensors stacked [n_i, slots, sub_i, w_i]: sub_i sub-rows of w_i
floats a slot; an online state's rows [d] are one sub-row) and its undo journal saved_i [groups,
max_rows * n_i, sub_i, w_i] (entry b * n_i + t: tensor t of the step's sequence b) with written_i
[groups, max_rows] int32 (the sub-rows group g + 1 overwrote, kept in saved_i[g] as they were
after group g), sequence b, which kept `accepted[b]` drafts, gets its states after group
accepted[b] back from the live states (those after the last group) by undoing the later groups,
last first:

    for g = groups - 2 down to accepted[b]:
        stacked_i[t, slots[b], x] = saved_i[g, b * n_i + t, x]     x in written_i[g, b], t < n_i

(A sub-row overwritten by several groups ends with the value before the first of them.)
"""

from __future__ import annotations

import torch


def state_commit_reference(stacked: list[torch.Tensor], saved: list[torch.Tensor], written: list[torch.Tensor],
                           slots: torch.Tensor, accepted: torch.Tensor) -> None:
    s = slots.shape[0]
    for state, copies, masks in zip(stacked, saved, written):
        n = state.shape[0]
        sub = state[0, 0].numel() // state.shape[-1]
        bits = 1 << torch.arange(sub, device=slots.device, dtype=torch.int32)
        for g in reversed(range(copies.shape[0] - 1)):
            undo = ((masks[g, :s, None] & bits) != 0) & (g >= accepted)[:, None]  # [S, sub]
            live = state[:, slots].reshape(n, s, sub, -1)
            kept = copies[g, :s * n].reshape(s, n, sub, -1).transpose(0, 1)
            state[:, slots] = torch.where(undo[None, :, :, None], kept, live).reshape(state[:, slots].shape)
