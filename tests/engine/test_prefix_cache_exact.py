"""Automatic prefix caching is exact: a request whose prefix pages are cached gives the same logits,
bit for bit, as a cold run of the same prompt (CPU, float32), for prefixes ending on and off a page
boundary, pages holding generated tokens, chunked prefill, preemption and LRU eviction.

"Cold run" = an engine with an empty cache and the same arguments (prefix caching on: its
prefill chunks end on the chunk grid, the step's token budget rounded down to whole pages, where
a hit resumes). Most tests take a budget of one page (grid = page); `test_hits_resume_on_the_chunk_grid`
takes two. Logits are the rows
the engine samples from, recorded by wrapping its `Sampler.sample`."""

from __future__ import annotations

import random

import pytest
import torch

from v4serve.engine.sampler import Sampler
from v4serve.engine.engine import Engine, EngineArgs
from v4serve.engine.sampling_params import SamplingParams

PAGE = 32  # the tiny preset's window = page size


@pytest.fixture
def recorded(monkeypatch):
    """params id -> list of the logits rows sampled for it."""
    rows: dict[int, list[torch.Tensor]] = {}
    real = Sampler.sample

    def sample(self, logits, requests, *args, **kwargs):
        for i, r in enumerate(requests):
            rows.setdefault(id(r.params), []).append(logits[i].clone())
        return real(self, logits, requests, *args, **kwargs)

    monkeypatch.setattr(Sampler, "sample", sample)
    return rows


def make_engine(model="tiny", **kw) -> Engine:
    args = dict(model=model, device="cpu", dtype="float32", max_num_seqs=4, max_model_len=8 * PAGE,
                max_num_batched_tokens=PAGE, progress=False, enable_prefix_caching=True)
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
    # (an overlapped decode step launched after a request's last token adds a row nobody reads)
    return [(list(outs[n]), torch.stack(recorded.pop(id(p))[:len(outs[n])])) for n, p in zip(names, params)]


_ids = iter(range(10**9))


def tokens(n: int, seed: int) -> list[int]:
    g = random.Random(seed)
    return [g.randrange(1, 500) for _ in range(n)]


def assert_same(a, b):
    assert a[0] == b[0]
    assert torch.equal(a[1], b[1]), f"max |diff| {(a[1] - b[1]).abs().max().item()}"


@pytest.mark.parametrize("shared", [2 * PAGE, 2 * PAGE + 11])  # on / off a page boundary
def test_hit_equals_cold_run(recorded, shared):
    # The first request keeps a snapshot at its last full page only; the second matches its first
    # two pages but has no snapshot to end a hit at, so it computes them and keeps one where the
    # sharing ends; the third hits the shared full pages.
    base = tokens(shared, 1)
    first, second, third = base + tokens(40, 2), base + tokens(29, 3), base + tokens(29, 4)
    warm = make_engine()
    run(warm, [first, second], recorded)
    assert warm.cache.prefix.hits == 0
    hit = run(warm, [third], recorded)[0]
    assert warm.cache.prefix.hits == 2 * PAGE  # the shared full pages, no more
    cold = run(make_engine(), [third], recorded)[0]
    assert_same(hit, cold)


def test_multi_turn(recorded):
    # Turn 2 = turn 1's prompt + its answer + a new message; turn 3 likewise. Pages holding decoded
    # tokens are not registered (decode steps round differently from the prefill of a cold run):
    # turn 2 hits turn 1's full prompt page, turn 3 every full page of turn 2's prompt.
    turn1 = tokens(PAGE + 20, 4)
    warm = make_engine()
    answer = run(warm, [turn1], recorded, max_tokens=2 * PAGE)[0][0]
    turn2 = turn1 + answer + tokens(9, 5)
    assert len(warm.cache.snapshots) == 1  # at the end of turn 1's last full prompt page
    hit = run(warm, [turn2], recorded)[0]
    assert warm.cache.prefix.hits == PAGE
    assert_same(hit, run(make_engine(), [turn2], recorded)[0])
    turn3 = turn2 + hit[0] + tokens(3, 6)
    hit3 = run(warm, [turn3], recorded)[0]
    assert warm.cache.prefix.hits == PAGE + len(turn2) // PAGE * PAGE
    assert_same(hit3, run(make_engine(), [turn3], recorded)[0])


def test_chunked_prefill_hit(recorded):
    # A 10-token budget splits every page into chunks; the state at each page end is still exact.
    base = tokens(3 * PAGE + 5, 6)
    warm = make_engine(max_num_batched_tokens=10)
    run(warm, [base + tokens(7, 7)], recorded)
    hit = run(warm, [base + tokens(30, 8)], recorded)[0]
    assert warm.cache.prefix.hits == 3 * PAGE
    assert_same(hit, run(make_engine(max_num_batched_tokens=10), [base + tokens(30, 8)], recorded)[0])


def test_lru_eviction_under_memory_pressure(recorded):
    # 5 pages, one request at a time: the first leaves its 2 full pages cached (a snapshot after
    # page 1), the second shares page 0 (and leaves a snapshot after it); the third evicts the first
    # one's later cached page (a sequence releases its last pages first) and its snapshot; the
    # fourth hits the surviving first page only.
    base = tokens(2 * PAGE, 9)
    tight = dict(max_model_len=4 * PAGE, num_kv_pages=5)
    warm = make_engine(**tight)
    run(warm, [base + tokens(10, 10), base[:PAGE] + tokens(5, 13), tokens(3 * PAGE + 5, 11)], recorded)
    third = base[:PAGE + 3] + tokens(40, 12)
    hit = run(warm, [third], recorded)[0]
    prefix = warm.cache.prefix
    assert prefix.hits == PAGE, "page 1 of the first request must have been evicted, page 0 kept"
    prefix.check()
    assert_same(hit, run(make_engine(**tight), [third], recorded)[0])


def test_evicted_snapshot_gives_a_shorter_exact_hit(recorded):
    # Two snapshot slots. The first request leaves one after page 1 (its last full page), the
    # second, sharing page 0 only, one after page 0; an unrelated third takes the least recently
    # used slot (the first's). The fourth shares both pages: its hit ends at page 0's snapshot, and
    # is still bit-exact.
    base = tokens(2 * PAGE, 30)
    warm = make_engine(num_prefix_snapshots=2)
    assert warm.kv_budget.snapshot_slots == 2 and warm.cache.snapshots.num_slots == 2
    run(warm, [base + tokens(10, 31), base[:PAGE] + tokens(20, 32)], recorded)
    assert warm.cache.prefix.hits == 0 and warm.cache.snapshots.evictions == 0
    run(warm, [tokens(PAGE + 5, 33)], recorded)
    assert warm.cache.snapshots.evictions == 1
    fourth = base + tokens(40, 34)
    assert len(warm.cache.match_prefix(fourth).pages) == 1 and warm.cache.match_prefix(fourth).shared == 2
    hit = run(warm, [fourth], recorded)[0]
    assert warm.cache.prefix.hits == PAGE
    assert_same(hit, run(make_engine(num_prefix_snapshots=2), [fourth], recorded)[0])
    # the fourth took a snapshot where the sharing ended: the next one hits both pages
    fifth = base + tokens(40, 35)
    assert_same(run(warm, [fifth], recorded)[0], run(make_engine(), [fifth], recorded)[0])
    assert warm.cache.prefix.hits == PAGE + 2 * PAGE


def test_preemption_with_shared_prefix(recorded):
    # Three requests sharing a page on 6 pages (2 pages of prompt each, 3 with their tokens): the
    # third shares the first's cached page, decoding runs out of pages, later arrivals are
    # preempted and resume from the cached page. Concurrent steps change the rounding of batched matmuls (the same
    # with and without caching), so this compares tokens and logits to 1e-5; then, on the pages
    # the churn left behind, a hit on a prefix computed alone is compared bit for bit.
    base = tokens(PAGE, 13)
    prompts = [base + tokens(n, 14 + n) for n in (10, 15, 20)]
    tight = dict(max_model_len=3 * PAGE, num_kv_pages=6, max_num_seqs=3)
    warm = make_engine(**tight)
    outs = run(warm, prompts, recorded, max_tokens=24, together=True)
    assert warm.scheduler.num_preemptions > 0, "the test must exercise preemption"
    assert warm.cache.prefix.hits >= 2 * PAGE
    for prompt, out in zip(prompts, outs):
        solo = run(make_engine(**tight), [prompt], recorded, max_tokens=24)[0]
        assert out[0] == solo[0]
        torch.testing.assert_close(out[1], solo[1], rtol=0, atol=1e-5)
    warm.cache.prefix.check()
    assert warm.cache.prefix.num_used == 0
    other = tokens(PAGE + 7, 98)
    run(warm, [other], recorded)
    last = other[:PAGE] + tokens(33, 99)
    assert_same(run(warm, [last], recorded)[0], run(make_engine(**tight), [last], recorded)[0])
    assert warm.cache.prefix.hits >= 3 * PAGE


def test_hit_equals_cold_run_on_parity_config_d(recorded, tmp_path):
    # Oracle config "d" (tests/model/oracle.py): the real CSA / HCA alternation, HCA ratio = window.
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1] / "model"))
    from oracle import ORACLE_CONFIGS, save_hf_checkpoint

    save_hf_checkpoint("d", tmp_path)
    w = ORACLE_CONFIGS["d"]["sliding_window"]
    make = lambda: make_engine(str(tmp_path), max_model_len=6 * w, max_num_batched_tokens=2 * w)  # noqa: E731
    warm = make()
    assert warm.cache.page_size == w
    base = tokens(2 * w + 5, 20)
    run(warm, [base + tokens(9, 21)], recorded)
    for end in (2 * w, 2 * w + 5):  # the second prompt diverges on / off a page boundary
        prompt = base[:end] + tokens(w + 3, 22 + end)
        hit = run(warm, [prompt], recorded)[0]
        assert_same(hit, run(make(), [prompt], recorded)[0])
    assert warm.cache.prefix.hits == 2 * 2 * w


def test_hits_resume_on_the_chunk_grid(recorded):
    """A budget of two pages: cold prompts prefill two pages a step, snapshots sit on multiples of
    two pages only, so a hit over three cached pages resumes after two, and equals a cold run."""
    make = lambda: make_engine(max_num_batched_tokens=2 * PAGE)  # noqa: E731
    base = tokens(3 * PAGE + 5, 11)
    warm = make()
    assert warm.cache.chunk_grid == 2 * PAGE
    run(warm, [base], recorded, max_tokens=1)
    assert len(warm.cache.snapshots) == 1  # at 2 pages (3 pages is off the grid)
    follow = base + tokens(20, 12)
    hit = run(warm, [follow], recorded)[0]
    assert warm.cache.prefix.hits == 2 * PAGE
    assert_same(hit, run(make(), [follow], recorded)[0])
