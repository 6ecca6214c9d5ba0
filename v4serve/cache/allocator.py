"""Free-list allocator of fixed-size KV pages (page = window = `config.sliding_window` tokens).

With prefix caching (`cache/prefix_cache.py`) a page nobody holds may still be worth keeping: it
is *cached* rather than free, and counts as free (`num_free`, what an allocation can get) until
an allocation that the truly free pages cannot serve evicts it, least recently cached first, and
tells the prefix cache (`on_evict`) to forget its key. Like vLLM's free block queue.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable


class OutOfPages(RuntimeError):
    """Not enough free pages; the scheduler preempts or waits, it never crashes on this."""


class PageAllocator:
    def __init__(self, num_pages: int):
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        self.num_pages = num_pages
        self._free = list(range(num_pages - 1, -1, -1))  # pop() hands out low page ids first
        self._cached: OrderedDict[int, None] = OrderedDict()  # evictable cached pages, oldest first
        self.on_evict: Callable[[int], None] | None = None

    @property
    def num_free(self) -> int:
        """Pages an allocation can get: free ones and evictable cached ones."""
        return len(self._free) + len(self._cached)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    @property
    def num_used(self) -> int:
        """Pages held by sequences."""
        return self.num_pages - self.num_free

    def allocate(self, n: int) -> list[int]:
        if n > self.num_free:
            raise OutOfPages(f"requested {n} pages, {self.num_free} free of {self.num_pages}")
        pages = [self._free.pop() for _ in range(min(n, len(self._free)))]
        while len(pages) < n:
            page, _ = self._cached.popitem(last=False)
            self.on_evict(page)
            pages.append(page)
        return pages

    def free(self, pages: list[int]) -> None:
        self._free.extend(reversed(pages))

    def cache(self, page: int) -> None:
        """Keep a released page as cached (evictable, the most recent)."""
        self._cached[page] = None

    def reclaim(self, page: int) -> bool:
        """Take a cached page back for a sequence (a prefix hit); False if it was not cached."""
        return self._cached.pop(page, 0) is None
