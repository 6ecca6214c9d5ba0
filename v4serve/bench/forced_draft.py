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
a step), its tokens are replaced.
"""

from __future__ import annotations

import math

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

    def __call__(self, request: Request, drafts: list[int]) -> list[int]:
        n = len(request.output_token_ids)
        forced = list(self.reference[request.request_id][n:n + self.k])
        count = self._proposals.get(request.request_id, 0)
        self._proposals[request.request_id] = count + 1
        wrong = accepted_schedule(self.mean_length, count)
        if wrong < len(forced):
            forced[wrong] = (forced[wrong] + 1) % self.vocab_size
        return forced
