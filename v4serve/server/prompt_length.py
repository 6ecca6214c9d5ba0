"""Refusing a prompt that cannot fit the context without tokenizing all of it.

A BPE tokenizer without a normalizer splits its input into tokens that each cover a contiguous,
non-empty run of the input, and a token covers at most as many characters as its vocabulary
entry has:

    byte-level BPE: entry chars = bytes covered >= characters covered (a character is 1-4 bytes)
    added tokens (`<｜User｜>`): matched verbatim, entry chars = characters covered

So with C = the longest vocabulary entry in characters, a text of L characters has at least
ceil(L / C) tokens. The DeepSeek-V4 tokenizer has C = 128 (a run of 128 dots), so a 7 MB prompt
has at least 57,000 tokens: it is refused on its length alone, in microseconds, where tokenizing
it takes seconds and ~1 GiB of memory. Prompts within the bound are tokenized and counted
exactly. A tokenizer with a normalizer (which may merge characters) gets no shortcut.

Chat prompts are bounded before they are even encoded: the DeepSeek-V4 encoding writes the
`content` of every message verbatim, except developer messages (dropped before the last user
turn in thinking mode), so the prompt has at least `rendered_content_chars(messages)` characters
(tests/server/test_prompt_length.py checks this against `encode_messages`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from v4serve.server.errors import APIError


@dataclass(frozen=True)
class PromptLimit:
    max_model_len: int
    max_chars_per_token: int | None  # None: no bound known, always tokenize

    @classmethod
    def for_tokenizer(cls, tokenizer_file: str | Path, max_model_len: int) -> "PromptLimit":
        return cls(max_model_len, max_chars_per_token(tokenizer_file))

    def min_tokens(self, text: str) -> int:
        """A lower bound on the number of tokens of `text` (0 when none is known)."""
        if self.max_chars_per_token is None:
            return 0
        return -(-len(text) // self.max_chars_per_token)

    def check_text(self, text: str, param: str) -> None:
        """Refuse `text` when it surely has at least `max_model_len` tokens."""
        self.check_chars(len(text), param)

    def check_chars(self, num_chars: int, param: str) -> None:
        """Refuse a prompt of at least `num_chars` characters when it surely has too many tokens."""
        if self.max_chars_per_token is None:
            return
        at_least = -(-num_chars // self.max_chars_per_token)
        if at_least >= self.max_model_len:
            raise APIError(
                f"{param}: the prompt has at least {at_least} tokens ({num_chars} characters or more), but this "
                f"model's context is {self.max_model_len} tokens (prompt plus at least one generated token)",
                param=param, code="context_length_exceeded")


def rendered_content_chars(messages: list) -> int:
    """Characters of message content that any encoding of `messages` contains (see above)."""
    total = 0
    for m in messages:
        if not isinstance(m, dict) or m.get("role") == "developer":
            continue
        content = m.get("content")
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return total


def max_chars_per_token(tokenizer_file: str | Path) -> int | None:
    """C above, read from a `tokenizer.json`; None when the bound does not hold (a normalizer,
    or a model that is not BPE)."""
    spec = json.loads(Path(tokenizer_file).read_text(encoding="utf-8"))
    normalizer = spec.get("normalizer")
    if normalizer and not (normalizer.get("type") == "Sequence" and not normalizer.get("normalizers")):
        return None
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        return None
    longest = max((len(piece) for piece in model["vocab"]), default=1)
    added = max((len(t.get("content", "")) for t in spec.get("added_tokens") or []), default=1)
    return max(longest, added, 1)
