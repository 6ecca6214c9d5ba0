"""Scheduler and page allocator under random load, without a model or a server.

A driver plays the engine: it admits requests at random times, advances every scheduled chunk,
appends a token when a chunk reaches its sequence's end, finishes requests at their length and
aborts some at random. The cache is small, so requests grow into preemption. After every step:
each page is either free or held by exactly one running sequence, each request is in exactly one
place, admission was fair (shared between groups, first-come-first-served within one), and at
the end every request finished and every page is free.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from v4serve.cache import CacheGeometry, OutOfPages, PageAllocator, PagedKVCache
from v4serve.engine.request import Request, Status
from v4serve.engine.sampling_params import SamplingParams
from v4serve.engine.scheduler import Scheduler
from v4serve.presets import preset_config

NUM_PAGES, PAGES_PER_SEQ, MAX_SEQS, STEP_TOKENS = 12, 6, 4, 64


def make_scheduler() -> Scheduler:
    geometry = CacheGeometry.from_config(preset_config("tiny"))
    cache = PagedKVCache(geometry, NUM_PAGES, MAX_SEQS, STEP_TOKENS, PAGES_PER_SEQ, torch.float32, "cpu")
    return Scheduler(cache, MAX_SEQS, STEP_TOKENS)


def check_invariants(scheduler: Scheduler, requests: list[Request], finished: set[str]) -> None:
    cache = scheduler.cache
    held = cache.page_table[cache.page_table >= 0].tolist()
    free = cache.allocator.num_free
    assert len(held) == len(set(held)), "a page is held twice"
    assert len(held) + free == NUM_PAGES, "pages leaked or double-freed"
    assert cache.allocator.num_used == len(held)
    running, waiting = {r.request_id for r in scheduler.running}, {r.request_id for r in scheduler.waiting}
    for r in requests:
        places = (r.request_id in running) + (r.request_id in waiting) + (r.request_id in finished)
        assert places == 1, f"{r.request_id} is in {places} places"
        assert (r.slot is not None) == (r.request_id in running)
    slots = [r.slot for r in scheduler.running]
    assert len(slots) == len(set(slots)) and len(slots) <= MAX_SEQS
    assert [r.arrival for r in scheduler.waiting] == sorted(r.arrival for r in scheduler.waiting)


def check_first_come_first_served(scheduler: Scheduler, waiting_before: list[Request],
                                  earliest_running: Request | None) -> None:
    """Admission takes the waiting queue from its head (no later arrival overtakes an earlier one),
    and preemption never takes the earliest running request: the oldest request always advances.
    (What the fair policy reduces to when every request is a group of its own.)"""
    admitted = [r.slot is not None for r in waiting_before]
    assert admitted == sorted(admitted, reverse=True), "a later arrival was admitted ahead of an earlier one"
    check_oldest_advances(earliest_running)


def check_oldest_advances(earliest_running: Request | None) -> None:
    if earliest_running is not None:
        assert earliest_running.slot is not None or earliest_running.status is Status.FINISHED, \
            "the earliest running request was preempted"


def check_fair_admission(scheduler: Scheduler, waiting_before: list[Request],
                         earliest_running: Request | None) -> None:
    """Within a group, no later arrival was admitted ahead of an earlier one. Across groups, a
    group was admitted into only while it had no more running sequences than every group left
    waiting: a group's running count only grows while admitting, so at its last admission it had
    (count after - 1), and each waiting group had at most its count after."""
    admitted = [r for r in waiting_before if r.slot is not None]
    left = list(scheduler.waiting)
    for group in {r.group_key for r in admitted}:
        latest_in = max(r.arrival for r in admitted if r.group_key == group)
        waiting_same = [r.arrival for r in left if r.group_key == group]
        assert not waiting_same or latest_in < min(waiting_same), f"group {group}: a later sequence overtook"
    after = Counter(r.group_key for r in scheduler.running)
    for group in {r.group_key for r in admitted}:
        for other in {r.group_key for r in left} - {group}:
            assert after[group] - 1 <= after[other], \
                f"group {group} admitted at {after[group] - 1} running while {other} waited with {after[other]}"
    check_oldest_advances(earliest_running)


@pytest.mark.parametrize("grouped", [False, True], ids=["singletons", "groups"])
@pytest.mark.parametrize("seed", range(6))
def test_random_admit_grow_preempt_abort_finish(seed, grouped):
    """Singletons: every request is its own group (first-come-first-served, checked as such).
    Groups: requests arrive in bursts of 1-6 sequences sharing a group, as prompts x n do."""
    rng = random.Random(seed)
    scheduler = make_scheduler()
    requests: list[Request] = []
    finished: set[str] = set()
    preemptions = 0
    for step in range(3000):
        if len(requests) < 40 and rng.random() < 0.3:
            group = f"g{len(requests)}" if grouped else None
            for _ in range(min(rng.randint(1, 6) if grouped else 1, 40 - len(requests))):
                prompt = [rng.randrange(1000) for _ in range(rng.randint(1, 100))]
                max_tokens = rng.randint(1, PAGES_PER_SEQ * 32 - len(prompt))
                request = Request(f"r{len(requests)}", prompt, SamplingParams(max_tokens=max_tokens), len(requests),
                                  group=group)
                requests.append(request)
                scheduler.add(request)
        live = [r for r in requests if r.request_id not in finished]
        if live and rng.random() < 0.02:
            victim = rng.choice(live)
            scheduler.finish(victim)
            finished.add(victim.request_id)
        waiting_before = list(scheduler.waiting)
        earliest_running = min(scheduler.running, key=lambda r: r.arrival, default=None)
        plan = scheduler.schedule()
        check_fair_admission(scheduler, waiting_before, earliest_running)
        if not grouped:
            check_first_come_first_served(scheduler, waiting_before, earliest_running)
        for chunk in plan:
            request = chunk.request
            assert chunk.start == request.num_computed and chunk.length > 0
            request.num_computed = chunk.end
            if chunk.end == request.num_tokens:
                request.output_token_ids.append(rng.randrange(1000))
                if len(request.output_token_ids) == request.params.max_tokens:
                    scheduler.finish(request)
                    finished.add(request.request_id)
        check_invariants(scheduler, requests, finished)
        if len(requests) == 40 and not scheduler.has_unfinished():
            break
    preemptions = sum(r.num_preemptions for r in requests)
    assert not scheduler.has_unfinished(), "requests are stuck"
    assert len(finished) == len(requests) == 40
    assert scheduler.cache.allocator.num_free == NUM_PAGES
    assert all(r.status is Status.FINISHED for r in requests)
    assert preemptions > 0, "the load never forced a preemption: the test does not cover it"


def test_a_later_request_is_not_starved_by_a_large_group():
    """A group of 30 sequences holds every slot; a one-sequence request arriving after it gets
    the first slot that frees (first-come-first-served would make it wait for all 30)."""
    scheduler = make_scheduler()
    big = [Request(f"big-{i}", [1] * 8, SamplingParams(max_tokens=3), i, group="big") for i in range(30)]
    for r in big:
        scheduler.add(r)
    small = Request("small", [2] * 8, SamplingParams(max_tokens=3), 30)
    scheduler.add(small)
    steps_until_small, finished_big = None, 0
    for step in range(200):
        for chunk in scheduler.schedule():
            r = chunk.request
            if r is small and steps_until_small is None:
                steps_until_small = step
            r.num_computed = chunk.end
            if chunk.end == r.num_tokens:
                r.output_token_ids.append(0)
                if len(r.output_token_ids) == r.params.max_tokens:
                    scheduler.finish(r)
                    finished_big += r is not small
        if steps_until_small is not None:
            break
    assert steps_until_small is not None and finished_big <= MAX_SEQS, (steps_until_small, finished_big)
    assert steps_until_small <= 4  # the first MAX_SEQS big sequences finish after 3 tokens


def test_preempted_request_resumes_with_its_tokens():
    scheduler = make_scheduler()
    long_ones = [Request(f"r{i}", [7] * 150, SamplingParams(max_tokens=40), i) for i in range(3)]
    for r in long_ones:
        scheduler.add(r)
    while scheduler.has_unfinished():
        for chunk in scheduler.schedule():
            r = chunk.request
            r.num_computed = chunk.end
            if chunk.end == r.num_tokens:
                r.output_token_ids.append(len(r.output_token_ids))
                if len(r.output_token_ids) == 40:
                    scheduler.finish(r)
    assert any(r.num_preemptions for r in long_ones)
    assert all(r.output_token_ids == list(range(40)) for r in long_ones)


@pytest.mark.parametrize("seed", range(3))
def test_allocator_conserves_pages(seed):
    rng = random.Random(seed)
    allocator = PageAllocator(50)
    held: list[list[int]] = []
    for _ in range(2000):
        if held and rng.random() < 0.45:
            allocator.free(held.pop(rng.randrange(len(held))))
        else:
            n = rng.randint(0, 8)
            try:
                held.append(allocator.allocate(n))
            except OutOfPages:
                assert n > allocator.num_free
        flat = [p for pages in held for p in pages]
        assert len(flat) == len(set(flat)) and allocator.num_free + len(flat) == 50
        assert all(0 <= p < 50 for p in flat)
