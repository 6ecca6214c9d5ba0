"""vLLM's spec-decode counters (`/metrics`, the engine bench)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodeMetrics:
    """vLLM's counters: drafts (verify steps of a sequence with >= 1 draft), draft tokens, accepted
    tokens, and accepted tokens by draft position. Mean acceptance length = 1 + accepted / drafts."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        if drafted == 0:
            return
        self.num_drafts += 1
        self.num_draft_tokens += drafted
        self.num_accepted_tokens += accepted
        while len(self.accepted_per_position) < drafted:
            self.accepted_per_position.append(0)
        for i in range(accepted):
            self.accepted_per_position[i] += 1

    def copy(self) -> "SpecDecodeMetrics":
        return SpecDecodeMetrics(self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens,
                                 list(self.accepted_per_position))

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0
