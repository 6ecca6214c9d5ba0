"""What every handler needs, built once by the app factory (no module-level state)."""

from __future__ import annotations

from dataclasses import dataclass

from v4serve.server.engine_loop import EngineLoop
from v4serve.server.errors import APIError
from v4serve.server.metrics import Metrics
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

    @property
    def logprobs(self) -> LogprobFormatter:
        return LogprobFormatter(self.tokenizer)

    def check_model(self, model: str | None) -> None:
        """A request may omit `model`; if it names one, it must be the model served here."""
        if model is not None and model != self.model_name:
            raise APIError(f"model: {model!r} does not exist; this server serves {self.model_name!r}",
                           param="model", status=404, code="model_not_found")
