"""Prefix snapshots: a bounded LRU pool of sequence states at page ends, where a cached prefix may
end and be resumed (`cache/prefix_cache.py`, `PagedKVCache`).

Resuming a sequence at position k * W (W = page size = window) needs, beside the cached pages'
compressed rows and index keys, the state a cold run has there:
* per layer the window ring: at a page boundary it holds exactly the last page's W rows, in
  position order: `W * row_bytes(window)` per layer;
* per overlapping compressor (and indexer compressor) the previous complete block's kv and score,
  first half of the rows and of the channels (all a position on a block boundary reads): a
  quarter of `CompressorShape.state_bytes`;
* a non-overlapping compressor's open block is empty at a page boundary (its ratio divides W),
  so it is the reset state and is not stored.

A slot holds one such state, tensor by tensor: `tensors[i][slot]` is stateful tensor i's value
(`[S, *shape_i]` each, S slots). Slot bytes at DeepSeek-V4-Flash dims: see `snapshot_slot_bytes`
in `cache/budget.py` and docs/prefix-caching.md.

Only a page with a snapshot at its end can end a prefix hit; the pages before it are reused
without one. Which page ends get one is the caller's policy (`PagedKVCache.snapshot_pages`); this
pool keeps at most S of them and, when full, drops the least recently used (taken or used by a
hit). Dropping a snapshot never breaks exactness: a later hit just ends at an earlier snapshot.
"""

from __future__ import annotations

from collections import OrderedDict

import torch


class SnapshotPool:
    def __init__(self, stateful: list[torch.Tensor], num_slots: int):
        if num_slots < 1:
            raise ValueError(f"num_prefix_snapshots must be >= 1 with prefix caching on, got {num_slots}")
        self.num_slots = num_slots
        self.tensors = [torch.zeros((num_slots, *t.shape[1:]), dtype=t.dtype, device=t.device) for t in stateful]
        self._slot_of: OrderedDict[int, int] = OrderedDict()  # page -> slot, least recently used first
        self._free = list(range(num_slots - 1, -1, -1))
        self.evictions = 0  # snapshots dropped to make room (not those whose page was evicted)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def __len__(self) -> int:
        return len(self._slot_of)

    def __contains__(self, page: int) -> bool:
        return page in self._slot_of

    def save(self, page: int, stateful: list[torch.Tensor], seq_slot: int) -> None:
        """Keep sequence slot `seq_slot`'s state as the snapshot at `page`'s end (the most recent)."""
        slot = self._slot_of.pop(page, None)
        if slot is None:
            if not self._free:
                _, victim = self._slot_of.popitem(last=False)
                self._free.append(victim)
                self.evictions += 1
            slot = self._free.pop()
        self._slot_of[page] = slot
        for t, snap in zip(stateful, self.tensors):
            snap[slot].copy_(t[seq_slot], non_blocking=True)

    def load(self, page: int, stateful: list[torch.Tensor], seq_slot: int) -> None:
        """Give sequence slot `seq_slot` the state at `page`'s end (a hit ending there)."""
        slot = self._slot_of[page]
        self._slot_of.move_to_end(page)
        for t, snap in zip(stateful, self.tensors):
            t[seq_slot].copy_(snap[slot])

    def drop(self, page: int) -> None:
        """Forget the page's snapshot, if any (its page was evicted or freed)."""
        slot = self._slot_of.pop(page, None)
        if slot is not None:
            self._free.append(slot)

    def move(self, src: int, dst: int) -> None:
        """The snapshot at `src`'s end now belongs to `dst` (a page registered earlier under the
        same key: same tokens, same prefix, so the same state); dropped if `dst` has one."""
        slot = self._slot_of.pop(src, None)
        if slot is None:
            return
        if dst in self._slot_of:
            self._free.append(slot)
        else:
            self._slot_of[dst] = slot
