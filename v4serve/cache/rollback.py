"""Exact rollback of an eager verify step's rejected tokens: a snapshot of what one sequence's step
can overwrite, restored before the accepted tokens are replayed. (Verify steps replayed as CUDA
graphs roll back on the device instead: `cache/state_checkpoints.py`.)

A verify step runs tokens at positions p .. p+k of a sequence through the prefill-style path. It
mutates, per layer:
* window ring rows `slot * R + (p+j) % R`, j = 0..k (R = the cache's `ring_size`): each held
  position p+j-R, still in the window of the positions after a rejection when R < W + k;
* the compressor / indexer states of the slot (open-block rows or online-softmax sums; a token
  that completes a block also shifts the overlap rows);
* compressed rows and index keys of blocks completed inside p .. p+k.

The snapshot copies the first two (k+1 ring rows per layer, the slot's state rows); the engine
restores it and replays the accepted tokens p .. p+a, which rewrites every one of them exactly
as a step without the rejected tokens would. Compressed rows and index keys need no copy: a row
of a block completed at position q is visible only to queries at positions >= q (`t < (pos+1) //
r`), and any later step reaching q runs position q itself first, rewriting the row before a
query can read it. V4.1's token history (Engram) is copied too.
"""

from __future__ import annotations

import torch

from v4serve.cache.kv_cache import PagedKVCache


class SlotSnapshot:
    def __init__(self, cache: PagedKVCache, slot: int, start: int, length: int):
        ring = cache.ring_size
        self.cache, self.slot = cache, slot
        device = cache.device
        self.ring_rows = slot * ring + torch.arange(start, start + min(length, ring), device=device) % ring
        pools = {id(view.window): view.window for view in cache._views}.values()
        self.windows = [(pool, pool.data[self.ring_rows].clone()) for pool in pools]
        self.states = [(t, t[slot].clone()) for state in cache._states for t in state.tensors()]
        self.history = None if cache.token_history is None else cache.token_history[slot].clone()

    def restore(self) -> None:
        for pool, rows in self.windows:
            pool.data[self.ring_rows] = rows
        for tensor, rows in self.states:
            tensor[self.slot] = rows
        if self.history is not None:
            self.cache.token_history[self.slot] = self.history
