"""SamplingParams: how one request is decoded (vLLM's field names and meanings)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = -1  # -1 or 0 = all tokens
    max_tokens: int | None = 16  # None = up to the model's maximum length
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None  # top-N logprobs per generated token (plus the sampled one)
    prompt_logprobs: int | None = None  # top-N logprobs per prompt token (plus the actual one)
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        checks = [
            ("n", isinstance(self.n, int) and self.n >= 1, "must be an integer >= 1"),
            ("temperature", _number(self.temperature) and self.temperature >= 0, "must be a number >= 0"),
            ("top_p", _number(self.top_p) and 0 < self.top_p <= 1, "must be in (0, 1]"),
            ("top_k", isinstance(self.top_k, int) and self.top_k >= -1, "must be -1, 0 or a positive integer"),
            ("max_tokens", self.max_tokens is None or (isinstance(self.max_tokens, int) and self.max_tokens > 0),
             "must be a positive integer"),
            ("min_tokens", isinstance(self.min_tokens, int) and self.min_tokens >= 0, "must be an integer >= 0"),
            ("stop", all(isinstance(s, str) and s for s in self.stop), "must be non-empty strings"),
            ("stop_token_ids", all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
             "must be non-negative integers"),
            ("seed", self.seed is None or isinstance(self.seed, int), "must be an integer"),
            ("logprobs", self.logprobs is None or (isinstance(self.logprobs, int) and self.logprobs >= 0),
             "must be an integer >= 0"),
            ("prompt_logprobs", self.prompt_logprobs is None
             or (isinstance(self.prompt_logprobs, int) and self.prompt_logprobs >= 0), "must be an integer >= 0"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{name} {rule}, got {getattr(self, name)!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"SamplingParams.min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and x == x  # excludes NaN
