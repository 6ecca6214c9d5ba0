"""SamplingParams: how one request is decoded (vLLM's field names, meanings and defaults).

Penalties follow vLLM: `repetition_penalty` (> 0, 1 = off) divides the positive logits and
multiplies the negative ones of every token seen in the prompt or the output; `frequency_penalty`
and `presence_penalty` (in [-2, 2], 0 = off) subtract `f * count` and `p * (count > 0)` over the
output tokens. `min_p` (in [0, 1]) drops tokens whose probability is below `min_p` times the top
token's. `logit_bias` adds a bias to given token ids (checked against the vocabulary when the
request is added). `min_tokens` masks end-of-sequence and `stop_token_ids` until that many tokens
have been generated. `structured_outputs` (vLLM's current name; it was `guided_decoding`) holds
one grammar constraint.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StructuredOutputsParams:
    """Exactly one constraint (vLLM's `StructuredOutputsParams`): a JSON schema (`json`, a dict or
    its JSON text), any JSON object (`json_object=True`), a regular expression, a choice among
    strings, or a grammar in EBNF (GBNF / xgrammar's dialect)."""

    json: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar", "json_object")
                 if getattr(self, name) not in (None, False)]
        if len(given) != 1:
            raise ValueError(f"StructuredOutputsParams needs exactly one of json, regex, choice, grammar, "
                             f"json_object; got {given or 'none'}")
        if self.json is not None:
            if isinstance(self.json, str):
                try:
                    self.json = json.loads(self.json)
                except json.JSONDecodeError as e:
                    raise ValueError(f"StructuredOutputsParams.json is not valid JSON: {e.msg}") from None
            if not isinstance(self.json, dict):
                raise ValueError(f"StructuredOutputsParams.json must be a JSON schema object, got {self.json!r}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"StructuredOutputsParams.{name} must be a non-empty string")
        if self.choice is not None and (
                not isinstance(self.choice, list) or not self.choice
                or not all(isinstance(c, str) and c for c in self.choice)):
            raise ValueError("StructuredOutputsParams.choice must be a non-empty list of non-empty strings")
        if self.json_object not in (None, True, False):
            raise ValueError("StructuredOutputsParams.json_object must be true or false")

    @property
    def key(self) -> tuple[str, str]:
        """(kind, text): what compiles to the grammar, for caching."""
        if self.json is not None:
            return "json", json.dumps(self.json)  # key order kept: it is the order properties are written in
        if self.regex is not None:
            return "regex", self.regex
        if self.choice is not None:
            return "choice", json.dumps(self.choice)
        if self.grammar is not None:
            return "grammar", self.grammar
        return "json_object", ""


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = all tokens
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    max_tokens: int | None = 16  # None = up to the model's maximum length
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None  # top-N logprobs per generated token (plus the sampled one)
    prompt_logprobs: int | None = None  # top-N logprobs per prompt token (plus the actual one)
    skip_special_tokens: bool = True
    structured_outputs: StructuredOutputsParams | None = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None and not isinstance(self.logit_bias, dict):
            raise ValueError(f"SamplingParams.logit_bias must be a dict of token id -> bias, got {self.logit_bias!r}")
        self.logit_bias = dict(self.logit_bias or {})
        checks = [
            ("n", _integer(self.n) and self.n >= 1, "must be an integer >= 1"),
            ("temperature", _number(self.temperature) and self.temperature >= 0, "must be a number >= 0"),
            ("top_p", _number(self.top_p) and 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", _integer(self.top_k) and self.top_k >= -1, "must be -1, 0 or a positive integer"),
            ("min_p", _number(self.min_p) and 0 <= self.min_p <= 1, "must be in [0, 1]"),
            ("presence_penalty", _number(self.presence_penalty) and -2 <= self.presence_penalty <= 2,
             "must be in [-2, 2]"),
            ("frequency_penalty", _number(self.frequency_penalty) and -2 <= self.frequency_penalty <= 2,
             "must be in [-2, 2]"),
            ("repetition_penalty", _number(self.repetition_penalty) and 0 < self.repetition_penalty
             and math.isfinite(self.repetition_penalty), "must be a finite number > 0"),
            ("logit_bias", all(_integer(t) and t >= 0 and _number(b) and math.isfinite(b)
                               for t, b in self.logit_bias.items()),
             "must map non-negative integer token ids to finite numbers"),
            ("max_tokens", self.max_tokens is None or (_integer(self.max_tokens) and self.max_tokens > 0),
             "must be a positive integer"),
            ("min_tokens", _integer(self.min_tokens) and self.min_tokens >= 0, "must be an integer >= 0"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
            ("stop_token_ids", all(_integer(t) and t >= 0 for t in self.stop_token_ids),
             "must be non-negative integers"),
            ("seed", self.seed is None or _integer(self.seed), "must be an integer"),
            ("logprobs", self.logprobs is None or (_integer(self.logprobs) and self.logprobs >= 0),
             "must be an integer >= 0"),
            ("prompt_logprobs", self.prompt_logprobs is None
             or (_integer(self.prompt_logprobs) and self.prompt_logprobs >= 0), "must be an integer >= 0"),
            ("structured_outputs", self.structured_outputs is None
             or isinstance(self.structured_outputs, StructuredOutputsParams), "must be a StructuredOutputsParams"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} {rule}, got {getattr(self, name)!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"SamplingParams.min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Needs the counts of the tokens seen so far."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # excludes NaN


def _integer(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
