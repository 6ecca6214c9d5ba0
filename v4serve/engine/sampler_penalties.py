"""Per-slot token counts on the device, for the penalties: what each running request has seen.

`counts` int32 [S, V]: how often each token occurs in the slot's output so far; `in_prompt` bool
[S, V]: which tokens its prompt holds. Allocated on the first penalized request. After each draw
the drawn tokens are added on the device (so an overlapped step, whose previous tokens the host
has not read yet, still sees them). A slot's rows are rebuilt from the host's token lists when the
request in it changed or its count disagrees with the host (a dropped in-flight row, preemption).
"""

from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A host list on `device` without waiting for the GPU (through pinned memory on CUDA; a plain
    `torch.tensor(..., device="cuda")` is a blocking copy that waits for the stream)."""
    if device.type == "cuda":
        return torch.tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)
    return torch.tensor(values, dtype=dtype, device=device)


class TokenCounts:
    def __init__(self, num_slots: int, vocab_size: int, device: torch.device):
        self.num_slots, self.vocab_size, self.device = num_slots, vocab_size, device
        self.counts: torch.Tensor | None = None
        self.in_prompt: torch.Tensor | None = None
        self._owner: list[object | None] = [None] * num_slots
        self._counted = [0] * num_slots  # output tokens the device rows hold

    def rows(self, requests: list, in_flight: int, pending: torch.Tensor | None,
             row_ids: list[int]) -> torch.Tensor:
        """Slots (int64 [P], on the device) of `requests`, whose rows are brought up to date first:
        each must hold the request's output tokens plus `in_flight` more, the latter being
        `pending[row_ids[i]]` (the device tokens of the previous step)."""
        if self.counts is None:
            self.counts = torch.zeros(self.num_slots, self.vocab_size, dtype=torch.int32, device=self.device)
            self.in_prompt = torch.zeros(self.num_slots, self.vocab_size, dtype=torch.bool, device=self.device)
        for request, row in zip(requests, row_ids):
            slot = request.slot
            expected = len(request.output_token_ids) + in_flight
            if self._owner[slot] is request and self._counted[slot] == expected:
                continue
            self._rebuild(slot, request, pending[row:row + 1] if in_flight else None)
            self._owner[slot], self._counted[slot] = request, expected
        return to_device([r.slot for r in requests], torch.int64, self.device)

    def _rebuild(self, slot: int, request, pending: torch.Tensor | None) -> None:
        self.counts[slot].zero_()
        self.in_prompt[slot].zero_()
        self.in_prompt[slot, to_device(request.prompt_token_ids, torch.int64, self.device)] = True
        ones = torch.ones(1, dtype=torch.int32, device=self.device)
        if request.output_token_ids:
            out = to_device(request.output_token_ids, torch.int64, self.device)
            self.counts[slot].index_put_((out,), ones.expand(len(out)), accumulate=True)
        if pending is not None:
            self.counts[slot].index_put_((pending.long(),), ones, accumulate=True)

    def add(self, requests: list, slots: torch.Tensor, tokens: torch.Tensor) -> None:
        """Count the tokens just drawn for these rows (on the device)."""
        self.counts.index_put_((slots, tokens), torch.ones_like(tokens, dtype=torch.int32), accumulate=True)
        for request in requests:
            self._counted[request.slot] += 1
