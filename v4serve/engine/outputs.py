"""What `LLM.generate` returns (vLLM's shapes: RequestOutput -> CompletionOutput -> Logprob)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int  # 1 = most likely
    decoded_token: str | None = None  # the token as text (' nesta', not the vocabulary entry 'Ġnesta')


# Per position: token id -> Logprob, holding the top-N tokens and the token actually there.
PositionLogprobs = dict[int, Logprob]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[PositionLogprobs] | None
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[PositionLogprobs | None] | None
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
