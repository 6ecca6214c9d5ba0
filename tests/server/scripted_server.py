"""Test-only entry point: the real server whose model writes scripted replies.

    python tests/server/scripted_server.py --port 8000 --script '[["weather", "<reply>"], ["", "ok"]]'

`ScriptedModel` replaces the engine's model (prefill and decode) and nothing else: the scheduler, the KV cache, the
sampler, the engine thread and the HTTP layer are the production ones. It keeps each sequence's
token history from the chunks it is given, finds where the reply began (after the last
`<｜Assistant｜>` and the `</think>` or `<think>` that follows it), and puts all probability on the
next token of the reply, then EOS. The reply is the first rule whose key occurs in the last user
turn (an empty key always matches).
"""

from __future__ import annotations

import argparse
import json

import torch

from v4serve.chat.tokens import ASSISTANT, USER
from v4serve.engine import Engine
from v4serve.server.serve import add_serve_args, serve
from v4serve.tokenizer import Tokenizer


class ScriptedModel(torch.nn.Module):
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos: int, rules: list[tuple[str, str]]):
        super().__init__()
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.rules = [(key, tokenizer.encode(reply) + [eos]) for key, reply in rules]
        self.eos = eos
        self.user = tokenizer.token_to_id(USER)
        self.assistant = tokenizer.token_to_id(ASSISTANT)
        self.history: dict[int, list[int]] = {}

    def forward(self, batch, cache) -> torch.Tensor:
        """Logits [len(batch.logits_indices), vocab] for prefill chunks and decode steps alike."""
        slots = batch.slots[batch.token_chunk].tolist()  # each token's sequence slot
        positions = batch.positions.tolist()
        for slot, pos, token in zip(slots, positions, batch.token_ids.tolist()):
            self.history[slot] = self.history.get(slot, [])[:pos] + [token]
        logits = torch.full((len(batch.logits_indices), self.vocab_size), -30.0)
        for row, t in enumerate(batch.logits_indices.tolist()):
            logits[row, self._next(self.history[slots[t]][:positions[t] + 1])] = 30.0
        return logits

    def _next(self, seen: list[int]) -> int:
        if self.assistant not in seen:
            return self.eos
        start = len(seen) - seen[::-1].index(self.assistant) - 1
        user = len(seen) - seen[::-1].index(self.user) - 1 if self.user in seen[:start] else 0
        question = self.tokenizer.decode(seen[user:start], skip_special_tokens=False)
        reply = next((ids for key, ids in self.rules if key in question), [self.eos])
        done = len(seen) - (start + 2)  # reply tokens already written
        return reply[done] if 0 <= done < len(reply) else self.eos


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    add_serve_args(parser)
    parser.add_argument("--script", type=json.loads, required=True, help="JSON list of [key, reply] rules")
    args = parser.parse_args()

    def make_engine(engine_args) -> Engine:
        engine = Engine(engine_args)
        eos = engine.config.eos_token_ids[0]
        engine.model = ScriptedModel(engine.tokenizer, engine.config.vocab_size, eos, args.script)
        engine.decode_runner.model = engine.model
        return engine

    return serve(args, make_engine)


if __name__ == "__main__":
    raise SystemExit(main())
