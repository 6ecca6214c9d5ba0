"""Prefix caching's switch (`enable_prefix_caching`, on by default where supported; vLLM's CLI flags),
its snapshot pool in the KV budget, and its /metrics counters (prompt tokens looked up / found, as
vLLM's)."""

from __future__ import annotations

import argparse
import random

import pytest

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
    assert _args().enable_prefix_caching is None  # on where supported
    assert _args("--no-enable-prefix-caching").enable_prefix_caching is False
    assert _args("--enable-prefix-caching").enable_prefix_caching is True
    assert _args("--num-prefix-snapshots", "3").num_prefix_snapshots == 3
    assert _args("--prefix-snapshot-fraction", "0.2").prefix_snapshot_fraction == 0.2


def test_on_by_default_and_off_with_the_flag():
    args = dict(model="tiny", device="cpu", max_model_len=4 * PAGE, max_num_seqs=3, progress=False)
    on = Engine(EngineArgs(**args))
    assert on.cache.prefix is not None and on.scheduler.cache.prefix is not None
    b = on.kv_budget
    assert b.snapshot_slots >= 3  # at least one per sequence slot
    assert any(line.startswith(f"Prefix caching: on ({b.snapshot_slots} snapshot slots") for line in on.banner())
    assert any("prefix snapshots" in line and f"{b.snapshot_slots} slots" in line for line in on.banner())
    off = Engine(EngineArgs(**args, enable_prefix_caching=False))
    assert off.cache.prefix is None and off.kv_budget.snapshot_slots == 0
    assert "Prefix caching: off (prefix caching is off (enable_prefix_caching=False))" in off.banner()
    assert not any("prefix snapshots" in line for line in off.banner())


def test_budget_accounts_the_snapshot_pool():
    from v4serve.cache.budget import snapshot_slot_bytes

    memory = 7 * 2**18  # 1.75 MiB: fewer pages than 3 full-length sequences could use, with or without snapshots
    args = dict(model="tiny", device="cpu", max_model_len=64 * PAGE, max_num_seqs=3, kv_cache_memory=memory,
                progress=False)
    on = Engine(EngineArgs(**args, prefix_snapshot_fraction=0.25))
    off = Engine(EngineArgs(**args, enable_prefix_caching=False))
    b = on.kv_budget
    # one slot: W window rows per layer + a quarter of each overlapping compressor's state (what
    # the pool allocated, independently of the budget's formula)
    assert b.snapshot_slot_bytes == snapshot_slot_bytes(on.cache.geometry, on.cache.dtype)
    assert on.cache.snapshot_nbytes == b.snapshot_bytes == b.snapshot_slots * b.snapshot_slot_bytes
    assert b.snapshot_slots == int(0.25 * memory // b.snapshot_slot_bytes)
    # the pool's bytes come out of the pages, and everything the cache allocated is in the budget
    page_bytes = b.bytes_per_token * b.page_size
    assert off.kv_budget.num_pages - b.num_pages == pytest.approx(b.snapshot_bytes / page_bytes, abs=1)
    assert on.cache.nbytes == b.total_bytes <= memory and off.cache.nbytes == off.kv_budget.total_bytes
    explicit = Engine(EngineArgs(**args, num_prefix_snapshots=5))
    assert explicit.kv_budget.snapshot_slots == 5 == explicit.cache.snapshots.num_slots


def test_refused_by_default_is_off_with_a_log_line(caplog):
    import logging

    from v4serve.engine.model_runner import prefix_caching_off

    geometry = Engine(EngineArgs(model="tiny", device="cpu", max_model_len=4 * PAGE, progress=False)).cache.geometry
    base = dict(model="tiny", device="cpu")
    assert prefix_caching_off(EngineArgs(**base), geometry) is None
    assert prefix_caching_off(EngineArgs(**base, tensor_parallel_size=2), geometry) is None  # ranks replay it
    spec = {"method": "mtp", "num_speculative_tokens": 1}
    assert "speculative" in prefix_caching_off(EngineArgs(**base, speculative_config=spec), geometry)
    with caplog.at_level(logging.INFO, logger="v4serve.engine.model_runner"):
        engine = Engine(EngineArgs(**base, max_model_len=4 * PAGE, progress=False, speculative_config=spec))
    assert engine.cache.prefix is None
    assert any("prefix caching is off with speculative decoding" in r.message and r.levelno == logging.INFO
               for r in caplog.records)


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
    prompts = [shared + [1, 2, 3], shared + [4, 5]]  # the second hits the first's snapshot after page 0
    # A budget of one page: hits resume on multiples of it (the chunk grid)
    args = dict(model="tiny", device="cpu", max_model_len=4 * PAGE, max_num_batched_tokens=PAGE, progress=False)
    on = Engine(EngineArgs(**args))  # on by default
    _serve(on, prompts)
    m = _metrics(on)
    assert m["v4serve_prefix_cache_queries_total"] == sum(map(len, prompts))
    assert m["v4serve_prefix_cache_hits_total"] == PAGE
    assert m["v4serve_kv_pages_used"] == 0  # cached pages are not counted as used
    off = Engine(EngineArgs(**args, enable_prefix_caching=False))
    assert off.cache.prefix is None
    # The snapshot pool is in the budget, counted exactly.
    assert on.cache.nbytes == on.kv_budget.total_bytes and off.cache.nbytes == off.kv_budget.total_bytes
    assert on.kv_budget.snapshot_bytes > 0 and off.kv_budget.snapshot_bytes == 0
    _serve(off, prompts)
    m = _metrics(off)
    assert m["v4serve_prefix_cache_queries_total"] == 0 and m["v4serve_prefix_cache_hits_total"] == 0
