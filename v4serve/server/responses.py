"""Pieces of OpenAI responses shared by both endpoints: ids, usage, logprobs, text deltas."""

from __future__ import annotations

import time
import uuid

from v4serve.engine import RequestOutput
from v4serve.engine.detokenizer import token_text
from v4serve.engine.outputs import PositionLogprobs
from v4serve.tokenizer import Tokenizer


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def usage(outputs: list[RequestOutput], n: int) -> dict:
    """Each prompt counts once however many choices it has; every choice's tokens count."""
    prompt = sum(len(o.prompt_token_ids) for o in outputs[::n])
    completion = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class IncrementalText:
    """The part of a growing completion text that is safe to send.

    Held back until the next step: a trailing U+FFFD (a multi-byte character not complete yet)
    and the last `len(stop) - 1` characters while stop strings may still match there."""

    def __init__(self, stop: list[str]):
        self.sent = ""
        self._hold = max((len(s) for s in stop), default=1) - 1

    def update(self, text: str, finished: bool) -> str:
        ready = text
        if not finished:
            ready = text[:len(text) - self._hold] if self._hold else text
            ready = ready.rstrip("\ufffd")
        if len(ready) <= len(self.sent):
            return ""
        delta = ready[len(self.sent):]
        self.sent = ready
        return delta


class LogprobFormatter:
    """Engine logprobs (token id -> Logprob) in the completions or the chat shape."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer

    def token(self, token_id: int) -> str:
        return token_text(self._tokenizer, token_id)

    def completions(self, positions: list[PositionLogprobs], token_ids: list[int], top_n: int, offset: int) -> dict:
        """`{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`; offsets start at `offset`."""
        tokens, values, tops, offsets = [], [], [], []
        for token_id, entry in zip(token_ids, positions):
            text = self.token(token_id)
            tokens.append(text)
            values.append(entry[token_id].logprob)
            ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:top_n]
            tops.append({self.token(t): lp.logprob for t, lp in ranked} if top_n else None)
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    def chat(self, positions: list[PositionLogprobs], token_ids: list[int], top_n: int) -> dict:
        """`{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}`."""
        content = []
        for token_id, entry in zip(token_ids, positions):
            ranked = sorted(entry.items(), key=lambda kv: kv[1].rank)[:top_n]
            item = self._chat_entry(token_id, entry[token_id].logprob)
            item["top_logprobs"] = [self._chat_entry(t, lp.logprob) for t, lp in ranked]
            content.append(item)
        return {"content": content}

    def prompt(self, positions: list[PositionLogprobs | None] | None) -> list | None:
        """vLLM's `prompt_logprobs`: per prompt token None (the first) or {token id: {"logprob",
        "rank", "decoded_token"}} for the top-N plus the actual token."""
        if positions is None:
            return None
        return [None if entry is None else {
            str(t): {"logprob": lp.logprob, "rank": lp.rank, "decoded_token": self.token(t)} for t, lp in entry.items()
        } for entry in positions]

    def _chat_entry(self, token_id: int, logprob: float) -> dict:
        text = self.token(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
