"""Automatic prefix caching is exact: a request whose prefix pages are cached gives the same logits,
bit for bit, as a cold run of the same prompt (CPU, float32), for prefixes ending on and off a page
boundary, pages holding generated tokens, chunked prefill, preemption and LRU eviction.

"Cold run" = an engine with an empty cache and the same arguments (prefix caching on: its
prefill chunks never cross a page boundary, the chunking a hit resumes from). Logits are the rows
the engine samples from, recorded by wrapping its `sample_batch`."""

from __future__ import annotations

import random

import pytest
import torch

import v4serve.engine.engine as engine_module
from v4serve.engine.engine import Engine, EngineArgs
from v4serve.engine.sampling_params import SamplingParams

PAGE = 32  # the tiny preset's window = page size


@pytest.fixture
def recorded(monkeypatch):
    """params id -> list of the logits rows sampled for it."""
    rows: dict[int, list[torch.Tensor]] = {}
    real = engine_module.sample_batch

    def sample(logits, params, generators):
        for i, p in enumerate(params):
            rows.setdefault(id(p), []).append(logits[i].clone())
        return real(logits, params, generators)

    monkeypatch.setattr(engine_module, "sample_batch", sample)
    return rows


def make_engine(model="tiny", **kw) -> Engine:
    args = dict(model=model, device="cpu", dtype="float32", max_num_seqs=4, max_model_len=8 * PAGE,
                max_num_batched_tokens=64, progress=False)
    return Engine(EngineArgs(**(args | kw)))


def run(engine: Engine, prompts: list[list[int]], recorded, max_tokens: int = 6, together: bool = False):
    """Each prompt's (token ids, logits rows); one after the other unless `together`."""
    params = [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True) for _ in prompts]
    outs = {}
    names = [f"r{next(_ids)}" for _ in prompts]
    pending = list(zip(names, prompts, params))
    while pending or engine.has_unfinished():
        if pending and (together or not engine.has_unfinished()):
            batch = pending if together else pending[:1]
            for name, prompt, p in batch:
                engine.add_request(name, prompt, p)
            pending = pending[len(batch):]
        for out in engine.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0].token_ids
    return [(list(outs[n]), torch.stack(recorded.pop(id(p)))) for n, p in zip(names, params)]


_ids = iter(range(10**9))


def tokens(n: int, seed: int) -> list[int]:
    g = random.Random(seed)
    return [g.randrange(1, 500) for _ in range(n)]


def assert_same(a, b):
    assert a[0] == b[0]
    assert torch.equal(a[1], b[1]), f"max |diff| {(a[1] - b[1]).abs().max().item()}"


@pytest.mark.parametrize("shared", [2 * PAGE, 2 * PAGE + 11])  # on / off a page boundary
def test_hit_equals_cold_run(recorded, shared):
    base = tokens(shared, 1)
    first, second = base + tokens(40, 2), base + tokens(29, 3)
    warm = make_engine()
    run(warm, [first], recorded)
    hit = run(warm, [second], recorded)[0]
    assert warm.cache.prefix.hits == 2 * PAGE  # the shared full pages, no more
    cold = run(make_engine(), [second], recorded)[0]
    assert_same(hit, cold)
