"""The prompts of `bench serve`'s workloads, as token ids, built from a seed (no server, no tokenizer).

A workload is a list of sessions; a session is a list of turns sent one after another (a turn is
sent once the answer to the one before it is complete). Each turn carries a label, which the
report groups TTFT by. Token ids are drawn uniformly from [1000, 100000) (inside every preset's
vocabulary, clear of the special tokens at its start).

* `random`: one-turn sessions, each its own prompt of `input_len` ids.
* `prefix_repetition` (vLLM's dataset of that name): `num_prefixes` prefixes of `prefix_len` ids;
  every prompt is one of them followed by `suffix_len` ids of its own. The prefixes take turns
  (`num_requests // num_prefixes` prompts each, the remainder to the first ones), in an order
  shuffled by the seed. Label: "new prefix" for the first prompt of each prefix in send order,
  "repeated prefix" for the others.
* `multi_turn`: `num_conversations` conversations of `num_turns` turns. Turn t (from 0) of
  conversation c sends
      system + own_c + (user_c0 + answer_c0) + ... + (user_c,t-1 + answer_c,t-1) + user_ct
  with `system` (`common_prefix_len` ids) shared by every conversation, `own_c`
  (`conversation_prefix_len` ids) conversation c's own, user turns of `turn_len` ids. Label:
  "turn t+1".

The answer in a conversation's history is a fixed random sequence of `answer_len` ids (the
request's `max_tokens`), standing in for what the model generated: the completions API returns
text, whose re-encoding need not give the generated ids. It does not change v4serve's hits: the
prefix cache keeps only pages computed by prefill (`cache/prefix_cache.py`), never decoded ones, so
a turn can reuse at most the previous turn's prompt, whatever the answer was. (A server that also
caches decoded tokens would reuse the answer of a real conversation; here it cannot.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

TOKEN_RANGE = (1000, 100000)  # [low, high) of the random ids


@dataclass(frozen=True)
class Turn:
    prompt: list[int]
    label: str = ""


Session = list[Turn]


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


def random_workload(num_requests: int, input_len: int, seed: int) -> list[Session]:
    rng = random.Random(seed)
    return [[Turn(random_ids(rng, input_len))] for _ in range(num_requests)]


def prefix_repetition_workload(num_requests: int, prefix_len: int, suffix_len: int, num_prefixes: int,
                               seed: int) -> list[Session]:
    if not 1 <= num_prefixes <= num_requests:
        raise ValueError(f"num_prefixes must be in [1, num_requests = {num_requests}], got {num_prefixes}")
    if prefix_len < 0 or suffix_len < 0 or prefix_len + suffix_len < 1:
        raise ValueError(f"prefix_len and suffix_len must be >= 0 with a sum >= 1, got {prefix_len}, {suffix_len}")
    rng = random.Random(seed)
    prefixes = [random_ids(rng, prefix_len) for _ in range(num_prefixes)]
    owners = [i % num_prefixes for i in range(num_requests)]  # per prefix: num_requests // num_prefixes (+1)
    rng.shuffle(owners)
    seen: set[int] = set()
    sessions = []
    for owner in owners:
        label = "repeated prefix" if owner in seen else "new prefix"
        seen.add(owner)
        sessions.append([Turn(prefixes[owner] + random_ids(rng, suffix_len), label)])
    return sessions


def multi_turn_workload(num_conversations: int, num_turns: int, common_prefix_len: int, conversation_prefix_len: int,
                        turn_len: int, answer_len: int, seed: int) -> list[Session]:
    if num_conversations < 1 or num_turns < 1:
        raise ValueError(f"num_conversations and num_turns must be >= 1, got {num_conversations}, {num_turns}")
    if min(common_prefix_len, conversation_prefix_len, answer_len) < 0 or turn_len < 1:
        raise ValueError("prefix and answer lengths must be >= 0 and turn_len >= 1")
    rng = random.Random(seed)
    system = random_ids(rng, common_prefix_len)
    sessions = []
    for _ in range(num_conversations):
        history = system + random_ids(rng, conversation_prefix_len)
        turns = []
        for t in range(num_turns):
            prompt = history + random_ids(rng, turn_len)
            turns.append(Turn(prompt, f"turn {t + 1}"))
            history = prompt + random_ids(rng, answer_len)
        sessions.append(turns)
    return sessions
