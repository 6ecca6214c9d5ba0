"""Automatic prefix caching: full KV pages found again by their tokens and everything before them.

A page holds W = `page_size` tokens (one window). A full page is keyed by
`(key of the page before it, its W token ids)`, a chain from the sequence's first page: two
sequences reach the same key only when all their tokens up to the page's end are equal (keys are
compared whole, so there are no hash collisions to fear; the integer a page's key starts with is
its parent page's node id, unique for the cache's life and never reused).

Every page is in exactly one of three states, so `free + used + cached == num_pages`:
* free: in the allocator's free list;
* used: referenced by at least one running sequence (`refs[page] > 0`); a used page may also be
  registered under a key (shared by several sequences);
* cached: registered, no references; the allocator keeps them in LRU order (least recently
  released first), counts them as free, and evicts them, oldest first, when its free list runs
  out (`allocator.py`).

What a page's key promises (kept by `PagedKVCache`): the page's compressed rows and index keys
were computed by prefill exactly as a cold run computes them. A hit may *end* only at a page that
also has a snapshot of the sequence state at its end (`cache/snapshots.py`: the window ring =
exactly this page's W rows, and the overlapping compressors' previous complete block); only some
pages have one (a bounded LRU pool), so a sequence reusing pages [0, k) with a snapshot at page
k - 1 continues at position k * W exactly as the sequence that computed them did.
"""

from __future__ import annotations

from typing import Callable

from v4serve.cache.allocator import PageAllocator

ROOT = 0  # the parent id of a sequence's first page


class PrefixCache:
    def __init__(self, allocator: PageAllocator, page_size: int):
        self.allocator = allocator
        self.page_size = page_size
        self._by_key: dict[tuple[int, tuple[int, ...]], int] = {}  # key -> page
        self._key_of: dict[int, tuple[int, tuple[int, ...]]] = {}  # registered page -> key
        self._node_of: dict[int, int] = {}  # registered page -> node id (the parent id of its children)
        self._next_node = ROOT + 1
        self.refs: dict[int, int] = {}  # page -> running sequences holding it (absent: 0)
        allocator.on_evict = self._forget
        self.on_forget: Callable[[int], None] | None = None  # told of every page whose key is dropped
        # vLLM's counters, in tokens: prompt tokens looked up at admission, and those found.
        self.queries = 0
        self.hits = 0

    # ------------------------------------------------------------------ accounting
    @property
    def num_cached(self) -> int:
        """Registered pages nobody holds (evictable; the allocator counts them as free)."""
        return self.allocator.num_cached

    @property
    def num_used(self) -> int:
        return len(self.refs)

    def is_cached(self, page: int) -> bool:
        return page in self.allocator._cached

    def check(self) -> None:
        """Raise if a page is lost or counted twice (free + used + cached == capacity)."""
        free, cached, used = set(self.allocator._free), set(self.allocator._cached), set(self.refs)
        if len(free) != len(self.allocator._free) or free & used or free & cached or used & cached:
            raise AssertionError(f"pages in two states: {sorted((free & used) | (free & cached) | (used & cached))}")
        if len(free) + len(used) + len(cached) != self.allocator.num_pages:
            raise AssertionError(f"free {len(free)} + used {len(used)} + cached {len(cached)} != "
                                 f"{self.allocator.num_pages} pages")
        if any(n <= 0 for n in self.refs.values()):
            raise AssertionError("a page with a non-positive reference count")
        if cached - set(self._key_of):
            raise AssertionError("an unregistered page is cached")

    # ------------------------------------------------------------------ pages
    def allocate(self, n: int) -> list[int]:
        """n fresh pages (the allocator evicts the least recently released cached pages when its
        free list runs short; raises OutOfPages, taking nothing, when even that is not enough)."""
        pages = self.allocator.allocate(n)
        for page in pages:
            self.refs[page] = 1
        return pages

    def _forget(self, page: int) -> None:
        """The allocator evicted a cached page: drop its key."""
        del self._by_key[self._key_of.pop(page)]
        del self._node_of[page]
        if self.on_forget is not None:
            self.on_forget(page)

    def acquire(self, pages: list[int]) -> None:
        """A sequence takes registered pages (a prefix hit)."""
        for page in pages:
            self.allocator.reclaim(page)
            self.refs[page] = self.refs.get(page, 0) + 1

    def release(self, pages: list[int]) -> None:
        """A sequence lets go of its pages: unregistered ones go back to the free list, registered
        ones nobody else holds become cached (most recently used last; a sequence's later pages
        are released first, so its earlier pages, which more prefixes share, are evicted last)."""
        freed = []
        for page in reversed(pages):
            n = self.refs.pop(page) - 1
            if n > 0:
                self.refs[page] = n
            elif page in self._key_of:
                self.allocator.cache(page)
            else:
                freed.append(page)
        if freed:
            self.allocator.free(freed[::-1])

    # ------------------------------------------------------------------ keys
    def is_registered(self, page: int) -> bool:
        return page in self._key_of

    def node_of(self, page: int) -> int:
        """The node id the successors of registered `page` chain from."""
        return self._node_of[page]

    def register(self, parent: int, tokens: tuple[int, ...], page: int) -> tuple[int, int]:
        """Register `page` (held by the caller) as the full page `tokens` after node `parent`;
        return (the node id its successors chain from, the page registered under that key). If
        another page already holds that key, the existing one stays registered and is returned
        with its node id (`page` stays private)."""
        key = (parent, tokens)
        existing = self._by_key.get(key)
        if existing is not None:
            return self._node_of[existing], existing
        if page in self._key_of:  # already registered under another key (cannot happen: keys are per position)
            raise AssertionError(f"page {page} registered twice")
        node = self._next_node
        self._next_node += 1
        self._by_key[key] = page
        self._key_of[page] = key
        self._node_of[page] = node
        return node, page

    def match(self, token_ids: list[int], max_pages: int) -> tuple[list[int], int]:
        """The longest run of registered pages that starts `token_ids` (at most `max_pages`), and
        the node id after it. Touches nothing (admission may still decide to wait). Where a hit
        may end (a page with a snapshot) is the caller's business (`PagedKVCache.match_prefix`)."""
        w, parent, pages = self.page_size, ROOT, []
        for k in range(min(max_pages, len(token_ids) // w)):
            page = self._by_key.get((parent, tuple(token_ids[k * w:(k + 1) * w])))
            if page is None:
                break
            pages.append(page)
            parent = self._node_of[page]
        return pages, parent
