"""Page accounting of the prefix cache (`cache/prefix_cache.py` in `PagedKVCache`), no model: a
randomized run of admit (with prefix hits) / compute / share / finish / abort, with evictions
when free pages run out, keeps every page in exactly one state (free + used + cached ==
capacity), reference counts equal to the sequences holding each page, and every registered
page found again only by exactly its tokens and everything before them."""

from __future__ import annotations

import random

import pytest
import torch

from v4serve.cache import CacheGeometry, OutOfPages, PagedKVCache
from v4serve.model.loader import resolve_config

W = 32  # tiny's page


def make_cache(num_pages: int, max_seqs: int) -> PagedKVCache:
    geometry = CacheGeometry.from_config(resolve_config("tiny"))
    cache = PagedKVCache(geometry, num_pages=num_pages, max_seqs=max_seqs, max_step_tokens=64,
                         max_pages_per_seq=6, dtype=torch.float32, device="cpu")
    assert cache.enable_prefix_caching(num_snapshots=3) is None  # fewer than the pages: snapshots get evicted too
    return cache


def check(cache: PagedKVCache, seqs: dict[int, list[int]]) -> None:
    prefix = cache.prefix
    prefix.check()
    held: dict[int, int] = {}
    for slot in seqs:
        for page in cache._pages[slot]:
            held[page] = held.get(page, 0) + 1
    assert held == prefix.refs
    free = len(cache.allocator._free)  # truly free (`num_free` also counts the evictable cached pages)
    assert free + prefix.num_used + prefix.num_cached == cache.allocator.num_pages
    assert cache.allocator.num_used == prefix.num_used
    # a snapshot belongs to a registered page (a hit may end there) or to a page a sequence holds
    # (taken, not yet registered); at most the pool's slots
    for page in cache.snapshots._slot_of:
        assert prefix.is_registered(page) or page in held, page
    assert len(cache.snapshots) <= cache.snapshots.num_slots


@pytest.mark.parametrize("seed", range(3))
def test_random_admit_share_finish_evict_abort(seed):
    rng = random.Random(seed)
    cache = make_cache(num_pages=14, max_seqs=4)
    stems = [[rng.randrange(50) for _ in range(5 * W)] for _ in range(3)]  # shared prefixes
    seqs: dict[int, list[int]] = {}  # slot -> its tokens
    computed: dict[int, int] = {}
    hits = evictions = shared = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.35 and cache.num_free_slots:  # admit a prompt that may share a stem's prefix
            stem = rng.choice(stems)
            prompt = stem[:rng.randrange(1, 4 * W)] + [rng.randrange(50) for _ in range(rng.randrange(0, W))]
            hit = cache.match_prefix(prompt)
            assert not hit.pages or hit.pages[-1] in cache.snapshots  # a hit ends at a snapshot
            for k, page in enumerate(hit.pages):  # a hit is exactly the tokens it was registered with
                key = cache.prefix._key_of[page]
                assert key[1] == tuple(prompt[k * W:(k + 1) * W])
            first = min(len(prompt), len(hit.pages) * W + W)
            if cache.pages_to_admit(hit, first) > 0:
                continue
            slot = cache.open_sequence()
            cache.attach_prefix(slot, hit, len(prompt))
            cached_before = cache.prefix.num_cached
            cache.reserve(slot, first)
            evictions += cached_before - cache.prefix.num_cached
            hits += len(hit.pages)
            seqs[slot], computed[slot] = prompt, len(hit.pages) * W
        elif op < 0.75 and seqs:  # compute one chunk (up to the next page end), maybe a decoded token
            slot = rng.choice(list(seqs))
            if computed[slot] == len(seqs[slot]):
                seqs[slot].append(rng.randrange(50))
            end = min(len(seqs[slot]), computed[slot] - computed[slot] % W + W)
            try:
                cache.reserve(slot, end)
            except OutOfPages:
                cache.close_sequence(slot)  # preempted
                del seqs[slot], computed[slot]
                check(cache, seqs)
                continue
            cache.snapshot_pages([(slot, end)])
            computed[slot] = end
            cache.register_pages(slot, end, lambda: seqs[slot])
        elif seqs:  # finish or abort
            slot = rng.choice(list(seqs))
            cache.close_sequence(slot)
            del seqs[slot], computed[slot]
        check(cache, seqs)
        shared = max(shared, max(cache.prefix.refs.values(), default=0))
    assert hits > 10 and evictions > 0 and shared > 1, (hits, evictions, shared)
    for slot in list(seqs):
        cache.close_sequence(slot)
    check(cache, {})
    assert cache.prefix.num_used == 0 and cache.allocator.num_free == 14 and cache.prefix.num_cached > 0


def test_keys_chain_the_whole_prefix():
    # Two sequences whose second pages are equal but whose first pages differ share nothing.
    cache = make_cache(num_pages=8, max_seqs=2)
    a, b = [1] * W + [7] * W + [3], [2] * W + [7] * W + [3]
    for tokens in (a, b):
        slot = cache.open_sequence()
        cache.attach_prefix(slot, cache.match_prefix(tokens), len(tokens))
        for end in (W, 2 * W):
            cache.reserve(slot, end)
            cache.snapshot_pages([(slot, end)])
            cache.register_pages(slot, end, lambda: tokens)
        cache.close_sequence(slot)
    # Each sequence kept a snapshot at its last full page only (the end of page 2).
    assert len(cache.match_prefix(a).pages) == 2 and len(cache.match_prefix(b).pages) == 2
    assert cache.match_prefix(a).pages[1] != cache.match_prefix(b).pages[1]
    assert cache.match_prefix([9] * W + [7] * W + [3]).pages == []
    # one token is always left to compute: page 1 of `a` is registered but has no snapshot
    short = cache.match_prefix(a[:2 * W])
    assert short.pages == [] and short.shared == 1


def test_hits_end_at_snapshots_and_shared_prefixes_get_one():
    # a: 3 full pages, a snapshot at its end only. b shares a's first 2 pages: no hit (no snapshot
    # there), but b takes one at the end of the shared pages, which c then hits; evicting it
    # (a full pool) makes c's hit shorter, never wrong.
    cache = make_cache(num_pages=12, max_seqs=2)
    stem = list(range(2 * W))

    def run(tokens):
        slot = cache.open_sequence()
        hit = cache.match_prefix(tokens)
        cache.attach_prefix(slot, hit, len(tokens))
        for end in range(len(hit.pages) * W + W, len(tokens) + 1, W):
            cache.reserve(slot, end)
            cache.snapshot_pages([(slot, end)])
            cache.register_pages(slot, end, lambda: tokens)
        cache.close_sequence(slot)
        check(cache, {})
        return hit

    a = stem + [100] * W + [1]
    assert run(a).pages == []
    b = stem + [200] * W + [2]
    hit = run(b)
    assert hit.pages == [] and hit.shared == 2
    c = stem + [300] * W + [3]
    assert len(run(c).pages) == 2  # the snapshot b took where the sharing ended
    # 3 slots, least recently used dropped first: c's snapshot evicted a's own (b's shared one was
    # just used by c's hit), so a now hits the 2 shared pages only, and takes its own back
    assert cache.snapshots.evictions == 1
    hit = run(a)
    assert len(hit.pages) == 2 and hit.shared == 3
    assert len(run(a).pages) == 3
    for k in range(3):  # three unrelated sequences fill the pool: every earlier snapshot is dropped
        run([1000 + k] * W + [4])
    assert cache.snapshots.evictions > 0
    hit = run(c)
    assert hit.pages == [] and hit.shared == 3  # c's pages are all still registered
