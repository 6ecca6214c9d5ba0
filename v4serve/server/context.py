"""What every handler needs, built once by the app factory (no module-level state)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from v4serve.server.engine_loop import EngineLoop
from v4serve.server.errors import APIError
from v4serve.server.limits import RequestLimits
from v4serve.server.metrics import Metrics
from v4serve.server.prompt_length import PromptLimit
from v4serve.server.protocol import check_fan_out
from v4serve.server.responses import LogprobFormatter
from v4serve.tokenizer import Tokenizer


@dataclass(frozen=True)
class ServingContext:
    engine_loop: EngineLoop
    metrics: Metrics
    tokenizer: Tokenizer  # the handlers' own instance; the engine thread has its own
    model_name: str
    max_model_len: int
    vocab_size: int
    max_body_bytes: int
    max_seqs_per_request: int
    prompt_limit: PromptLimit
    # Parsing, validation and tokenization run here, never on the event loop (app.py).
    workers: ThreadPoolExecutor
    limits: RequestLimits = RequestLimits()  # the waiting-queue bound and the request timeout

    @property
    def logprobs(self) -> LogprobFormatter:
        return LogprobFormatter(self.tokenizer)

    def check_model(self, model: str | None) -> None:
        """A request may omit `model`; if it names one, it must be the model served here."""
        if model is not None and model != self.model_name:
            raise APIError(f"model: {model[:100]!r} does not exist; this server serves {self.model_name!r}",
                           param="model", status=404, code="model_not_found")

    def check_fan_out(self, num_prompts: int, n: int, param: str) -> None:
        check_fan_out(num_prompts, n, self.max_seqs_per_request, param)

    def tokenize(self, text: str, param: str) -> list[int]:
        """Token ids of a prompt text; a text surely longer than the context is refused first,
        from its length alone (prompt_length.py)."""
        self.prompt_limit.check_text(text, param)
        return self.tokenizer.encode(text)
