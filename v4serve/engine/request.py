"""A request's state inside the engine."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from typing import Any

from v4serve.engine.detokenizer import IncrementalDetokenizer
from v4serve.engine.outputs import PositionLogprobs
from v4serve.engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival: int  # arrival order: first come, first served
    prompt: str | None = None
    group: str | None = None  # the API request this sequence belongs to (None: its own group)
    seed: int = 0  # the sampler's noise key (the params' seed, or one the engine drew)
    grammar: Any = None  # structured outputs: the request's xgrammar GrammarMatcher
    spec_generator: Any = None  # speculative decoding's draws (engine/spec_decode.py generator_of), seeded from `seed`
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[PositionLogprobs] = field(default_factory=list)
    prompt_logprobs: list[PositionLogprobs | None] = field(default_factory=list)
    cumulative_logprob: float = 0.0
    num_computed: int = 0  # tokens whose KV is in the cache
    slot: int | None = None
    status: Status = Status.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    text: str = ""
    detokenizer: IncrementalDetokenizer | None = None
    num_preemptions: int = 0

    @property
    def group_key(self) -> str:
        return self.request_id if self.group is None else self.group

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def token_at(self, position: int) -> int:
        n_prompt = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n_prompt else self.output_token_ids[position - n_prompt]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        return self.params.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)
