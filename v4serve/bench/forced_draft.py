"""A bench-only draft with a chosen mean acceptance length (random weights accept almost nothing).

It proposes the target's own greedy continuation (`reference`: each request's output tokens from
an earlier greedy run of the same prompts) and makes draft number a_n of the sequence's n-th
proposal wrong, where the accepted counts a_0, a_1, ... follow a fixed schedule of mean L - 1:

    a_n = floor((n + 1) (L - 1)) - floor(n (L - 1))        (each 0..k when L - 1 <= k)

so greedy verification accepts exactly a_n drafts (then emits the target's token at the wrong one,
or the bonus token when a_n = k) and the mean acceptance length 1 + accepted / drafts is L over
any whole number of periods (L = 2.0: 1, 1, ...; 2.8: 1, 2, 2, 2, 2, ...; 3.5: 2, 3, 2, 3, ...).
The output stays the target's greedy output whatever the draft (speculative decoding is exact),
so the reference stays right as long as the run reproduces it; the engine's own counters
(`SpecDecodeMetrics`) report the acceptance that actually happened.

Used as the speculative stepper's `draft_filter`: the MTP layer still drafts (its cost is part of
a step), its tokens are replaced. `on_device` gives the same drafts on the device for a step
launched before the host has read its predecessor (the stepper's continuations), so the forced
runs overlap the host with the GPU as an unfiltered run does: the proposal count it uses is the
one the host's call for the same drafts will use (that call comes after the launch), the output
length comes from the row's start on the device.
"""

from __future__ import annotations

import math

import torch

from v4serve.engine.request import Request


def accepted_schedule(mean_length: float, n: int) -> int:
    """Drafts accepted at a sequence's n-th proposal (0-based) for mean acceptance length `mean_length`."""
    rate = mean_length - 1.0
    return math.floor((n + 1) * rate + 1e-9) - math.floor(n * rate + 1e-9)


class ForcedAcceptance:
    def __init__(self, reference: dict[str, list[int]], k: int, mean_length: float, vocab_size: int):
        if not 1.0 <= mean_length <= k + 1:
            raise ValueError(f"a mean acceptance length of {mean_length} needs 1 <= L <= k + 1 = {k + 1}")
        self.reference, self.k, self.mean_length, self.vocab_size = reference, k, mean_length, vocab_size
        self._proposals: dict[str, int] = {}
        self._on_device: dict[str, torch.Tensor] = {}  # each request's reference, padded by k, on the device

    def __call__(self, request: Request, drafts: list[int]) -> list[int]:
        n = len(request.output_token_ids)
        forced = list(self.reference[request.request_id][n:n + self.k])
        wrong = self._wrong_at(request)
        self._proposals[request.request_id] = self._proposals.get(request.request_id, 0) + 1
        if wrong < len(forced):
            forced[wrong] = (forced[wrong] + 1) % self.vocab_size
        return forced

    def _wrong_at(self, request: Request) -> int:
        """The draft made wrong at the request's next proposal (its accepted count)."""
        return accepted_schedule(self.mean_length, self._proposals.get(request.request_id, 0))

    def on_device(self, requests: list[Request], drafts: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """`__call__`'s drafts [n, k] for rows whose last token sits at `starts` [n] (on the device),
        without reading the device: past the reference's end (the last steps before max_tokens)
        they are padding the stepper's caps never keep."""
        device = drafts.device

        def to_device(host: torch.Tensor) -> torch.Tensor:  # pinned on CUDA: an asynchronous copy
            return (host.pin_memory() if device.type == "cuda" else host).to(device, non_blocking=True)

        for r in requests:
            if r.request_id not in self._on_device:
                reference = [*self.reference[r.request_id], *[0] * self.k]
                self._on_device[r.request_id] = to_device(torch.tensor(reference, dtype=torch.int64))
        table = torch.nn.utils.rnn.pad_sequence([self._on_device[r.request_id] for r in requests], batch_first=True)
        # per row: its prompt length, and the draft made wrong at its next proposal (k: none)
        rows = to_device(torch.tensor([[len(r.prompt_token_ids), self._wrong_at(r)] for r in requests],
                                      dtype=torch.int64))
        produced = starts + 1 - rows[:, 0]  # output tokens once the row's last token is in
        columns = torch.arange(self.k, device=device)
        forced = table.gather(1, (produced[:, None] + columns).clamp(max=table.shape[1] - 1))
        return torch.where(columns == rows[:, 1:], (forced + 1) % self.vocab_size, forced)
