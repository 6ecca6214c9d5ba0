"""vLLM's `speculative_config` ({"method": "mtp", "num_speculative_tokens": k}) and the sampling
fields speculative decoding refuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

METHODS = ("mtp",)
MAX_SPECULATIVE_TOKENS = 16
# The head the MTP drafts read: "shared", the target's lm head (as the checkpoint has it); "fp8", an
# FP8 block-scaled copy of it made at load (e4m3 codes, ue8m0 scales per 128 x 128, weight-only
# numerics): half the bytes a draft step reads. The output does not depend on it (verification runs
# the target's head); a draft may differ where its logits nearly tie. "auto" (default): "fp8" on CUDA
# (H200, 30-layer Flash, k = 3, session 23: the commit + draft graph 1.568 -> 1.238 ms at c1, 2.262 ->
# 1.946 at c8; TPOT at acceptance 2.8 3.613 -> 3.495 / 9.535 -> 9.410 ms), "shared" on the CPU.
DRAFT_HEADS = ("auto", "shared", "fp8")
FIELDS = ("method", "num_speculative_tokens", "draft_head")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    draft_head: str = "auto"

    @classmethod
    def from_dict(cls, raw: dict[str, Any] | None) -> "SpeculativeConfig | None":
        if raw is None:
            return None
        if not isinstance(raw, dict):
            raise ValueError(f"speculative_config must be a dict such as {{\"method\": \"mtp\", "
                             f"\"num_speculative_tokens\": 3}}, got {raw!r}")
        unknown = sorted(set(raw) - set(FIELDS))
        if unknown:
            raise ValueError(f"speculative_config: unknown field(s) {unknown} (known: {', '.join(FIELDS)})")
        method = raw.get("method", "mtp")
        if method not in METHODS:
            raise ValueError(f"speculative_config.method must be one of {list(METHODS)}, got {method!r}")
        k = raw.get("num_speculative_tokens")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"speculative_config.num_speculative_tokens must be an integer in "
                             f"[1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        head = raw.get("draft_head", "auto")
        if head not in DRAFT_HEADS:
            raise ValueError(f"speculative_config.draft_head must be one of {list(DRAFT_HEADS)}, got {head!r}")
        return cls(method, k, head)


def check_request(params) -> None:
    """Sampling fields speculative decoding does not combine exactly yet: refused by name (a 400)."""
    bad = [name for name, on in (
        ("structured_outputs", params.structured_outputs is not None),
        ("presence_penalty", params.presence_penalty != 0), ("frequency_penalty", params.frequency_penalty != 0),
        ("repetition_penalty", params.repetition_penalty != 1), ("logit_bias", bool(params.logit_bias)),
        ("min_tokens", params.min_tokens > 0)) if on]
    if bad:
        raise ValueError(f"speculative decoding (speculative_config) does not support {', '.join(bad)} yet")


def resolve_draft_head(config: SpeculativeConfig | None, device) -> str:
    """The head the drafts read on `device`: "auto" is "fp8" on CUDA, "shared" elsewhere."""
    if config is None:
        return "shared"
    if config.draft_head == "auto":
        return "fp8" if device.type == "cuda" else "shared"
    return config.draft_head
