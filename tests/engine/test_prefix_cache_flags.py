"""Prefix caching's switch (`enable_prefix_caching`, off by default for now; vLLM's CLI flags) and its
/metrics counters (prompt tokens looked up / found, as vLLM's)."""

from __future__ import annotations

import argparse
import random

from v4serve.engine.engine import Engine, EngineArgs
from v4serve.engine.sampling_params import SamplingParams
from v4serve.server.engine_loop import EngineLoop
from v4serve.server.metrics import Metrics
from v4serve.server.serve import add_serve_args, engine_args

PAGE = 32


def _args(*argv: str) -> EngineArgs:
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    return engine_args(parser.parse_args(list(argv)))


def test_cli_flags():
    assert _args().enable_prefix_caching is False
    assert _args("--no-enable-prefix-caching").enable_prefix_caching is False
    assert _args("--enable-prefix-caching").enable_prefix_caching is True


def _serve(engine: Engine, prompts: list[list[int]]) -> None:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
        while engine.has_unfinished():
            engine.step()


def _metrics(engine: Engine) -> dict[str, float]:
    text = Metrics("tiny").render(EngineLoop(engine, Metrics("tiny")).snapshot)
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line and line[0] != "#"}


def test_metrics_count_prompt_tokens_and_hits():
    g = random.Random(0)
    shared = [g.randrange(500) for _ in range(PAGE + 3)]
    prompts = [shared + [1, 2, 3], shared + [4, 5]]
    args = dict(model="tiny", device="cpu", max_model_len=4 * PAGE, progress=False)
    on = Engine(EngineArgs(**args, enable_prefix_caching=True))
    _serve(on, prompts)
    m = _metrics(on)
    assert m["v4serve_prefix_cache_queries_total"] == sum(map(len, prompts))
    assert m["v4serve_prefix_cache_hits_total"] == PAGE
    assert m["v4serve_kv_pages_used"] == 0  # cached pages are not counted as used
    off = Engine(EngineArgs(**args, enable_prefix_caching=False))
    assert off.cache.prefix is None
    # The page-end snapshots are a paged tier of the budget, counted exactly.
    assert on.cache.nbytes == on.kv_budget.total_bytes and off.cache.nbytes == off.kv_budget.total_bytes
    assert on.kv_budget.tier_bytes_per_token["page-end snapshots"] > 0
    assert "page-end snapshots" not in off.kv_budget.tier_bytes_per_token
    _serve(off, prompts)
    m = _metrics(off)
    assert m["v4serve_prefix_cache_queries_total"] == 0 and m["v4serve_prefix_cache_hits_total"] == 0
