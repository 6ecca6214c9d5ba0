"""KV cache: paged pools, page tables, the page allocator and the memory budget."""

from v4serve.cache.allocator import OutOfPages, PageAllocator
from v4serve.cache.batch import ForwardBatch, SequenceChunk
from v4serve.cache.geometry import CacheGeometry
from v4serve.cache.kv_cache import PagedKVCache
from v4serve.cache.view import LayerCache, Pool

__all__ = ["CacheGeometry", "ForwardBatch", "LayerCache", "OutOfPages", "PageAllocator", "PagedKVCache", "Pool", "SequenceChunk"]
