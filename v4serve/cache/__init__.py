"""KV cache: paged pools, page tables, the page allocator and the memory budget."""

from v4serve.cache.allocator import OutOfPages, PageAllocator
from v4serve.cache.batch import ForwardBatch, SequenceChunk
from v4serve.cache.geometry import CacheGeometry
from v4serve.cache.kv_cache import PagedKVCache

__all__ = ["CacheGeometry", "ForwardBatch", "OutOfPages", "PageAllocator", "PagedKVCache", "SequenceChunk"]
