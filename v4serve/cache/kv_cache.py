"""Paged KV cache of a DeepSeek-V4 model: the pools, the page table, compressor state and the
addressing of a step (see `cache/batch.py` for the layout).

Two extra rows keep decode steps free of host decisions, so they can run as CUDA graphs:
* a padding slot (`padding_slot`, never handed out) that the graph runner gives the rows it pads
  a batch with: their window, state and compressed writes land in memory nobody reads;
* a scratch row at the end of each compressed / index pool, where a decode step writes the
  pooled row of every sequence whose block did not complete this step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from v4serve.cache.allocator import PageAllocator
from v4serve.cache.batch import ForwardBatch, SequenceChunk
from v4serve.cache.geometry import CacheGeometry, CompressorShape
from v4serve.cache.prefix_cache import ROOT, PrefixCache
from v4serve.cache.snapshots import SnapshotPool
from v4serve.cache.view import LayerCache, Pool
from v4serve.formats import RowFormat

# Pools are handed to Triton kernels that gather rows with 16-byte loads.
_ALIGNMENT = 16
TICKETS = 1024  # counters in the step's ticket buffer (ForwardBatch.tickets)


class PrefixHit(NamedTuple):
    """`PagedKVCache.match_prefix`'s answer: the cached pages reused (ending at a snapshot), the
    node id after them, and the registered pages matched in all (>= len(pages))."""

    pages: list[int]
    node: int
    shared: int


@dataclass
class _Chain:
    """A slot's prefix-caching progress: pages registered, the node id after them, tokens
    computed by prefill since admission, and the page ends where it takes snapshots."""

    done: int
    node: int
    prefilled: int
    snapshot_ends: set[int]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str, row_align: int = _ALIGNMENT
           ) -> torch.Tensor:
    t = torch.zeros(shape, dtype=dtype, device=device)
    if t.numel() and (t.data_ptr() % _ALIGNMENT or (t.stride(0) * t.element_size()) % row_align):
        raise RuntimeError(f"pool of shape {shape} {dtype} does not start {_ALIGNMENT}-byte aligned with rows "
                           f"{row_align}-byte aligned")
    return t


def _pool(rows: int, fmt: RowFormat, dim: int, packed: bool, dtype: torch.dtype, device: torch.device | str) -> Pool:
    """A tier's pool: `rows` packed rows of `fmt.row_bytes(dim)` bytes (uint8, rows start on a
    4-byte word; the format pads rows read with 16-byte loads to 16), or rows of `dim` values."""
    packed = packed and fmt.packed
    if packed:
        return Pool(_zeros((rows, fmt.row_bytes(dim)), torch.uint8, device, row_align=4), fmt, dim, True, dtype)
    return Pool(_zeros((rows, dim), dtype, device), fmt, dim, False, dtype)


class CompressorState:
    """An overlapping compressor's rows: fp32 kv and score of each sequence's open block and of its
    previous complete block, `[slots, 2 * ratio, 2 * head_dim]`. For a sequence at position p, the
    open block's rows sit at `ratio + i` for i < p % ratio; rows `[0, ratio)` hold the last
    complete block (score -inf before the first one)."""

    def __init__(self, shape: CompressorShape, max_seqs: int, device: torch.device | str):
        # One allocation [2, slots, ...] (kv, score): a slot's whole state is one strided row of it.
        self.stacked = torch.zeros(2, max_seqs, shape.state_rows, shape.state_width, device=device)
        self.kv, self.score = self.stacked
        self.score.fill_(float("-inf"))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.kv, self.score

    def reset(self, slot: int) -> None:
        self.kv[slot].zero_()
        self.score[slot].fill_(float("-inf"))


class OnlinePoolState:
    """A non-overlapping compressor's open block, folded in as its tokens arrive (online softmax,
    fp32, `[slots, head_dim]` each): per channel the running maximum of the scores, the sum of
    exp(score - max), and the sum of exp(score - max) * kv. A complete block's row is acc / sum.
    For ratio 128 this is 3 vectors per sequence instead of 2 x 128 rows."""

    def __init__(self, shape: CompressorShape, max_seqs: int, device: torch.device | str):
        self.stacked = torch.zeros(3, max_seqs, shape.head_dim, device=device)  # (max, sum, acc), one allocation
        self.max, self.sum, self.acc = self.stacked
        self.max.fill_(float("-inf"))

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.max, self.sum, self.acc

    def reset(self, slot: int) -> None:
        self.max[slot].fill_(float("-inf"))
        self.sum[slot].zero_()
        self.acc[slot].zero_()


def compressor_state(shape: CompressorShape, max_seqs: int, device: torch.device | str):
    return (CompressorState if shape.overlap else OnlinePoolState)(shape, max_seqs, device)


class PagedKVCache:
    def __init__(
        self,
        geometry: CacheGeometry,
        num_pages: int,
        max_seqs: int,
        max_step_tokens: int,
        max_pages_per_seq: int,
        dtype: torch.dtype,
        device: torch.device | str,
        ring_extra: int = 0,
    ):
        """`ring_extra`: rows each window ring holds beyond the window, so that a step may write
        rows up to `ring_extra` positions past a sequence's last kept token without displacing a
        row still in some later token's window (speculative verify steps: `build_verify_batch`)."""
        self.geometry = geometry
        self.plan = geometry.plan
        self.page_size = w = geometry.page_size
        if ring_extra < 0:
            raise ValueError(f"ring_extra must be >= 0, got {ring_extra}")
        self.ring_size = ring = w + ring_extra  # window ring rows per slot: position q at q % ring_size
        self.max_seqs = max_seqs
        self.max_step_tokens = max_step_tokens
        self.dtype = dtype
        self.device = torch.device(device)
        self.allocator = PageAllocator(num_pages)
        self.padding_slot = max_seqs
        self.tickets = torch.zeros(TICKETS, dtype=torch.int32, device=self.device)  # see ForwardBatch.tickets
        slots = max_seqs + 1
        self.page_table = torch.full((slots, max_pages_per_seq), -1, dtype=torch.int64)
        # Per compress ratio, the pool row of each compressed row of each slot (int32, -1 where the
        # page is not allocated), kept in step with the page table on the host and on the device
        # (the same tensors on the CPU): a decode step gathers its sequences' rows in one kernel.
        self.compressed_row_table = {
            r: compressed_rows_of_pages(self.page_table, r, w) for r in geometry.ratios
        }
        self.device_compressed_row_table = {r: t.to(self.device) for r, t in self.compressed_row_table.items()}
        # Constants of the decode addressing: window offsets 1-W..0 and the row index 0..slots-1.
        self._window_offsets = torch.arange(1 - w, 1, device=self.device)
        self._row_index = torch.arange(slots, device=self.device)
        self._verify_offsets: dict[int, torch.Tensor] = {}  # verify rows per sequence -> [rows] 0..rows-1
        self._pages: dict[int, list[int]] = {}
        self._free_slots = list(range(max_seqs - 1, -1, -1))
        self.staging_base = slots * ring
        window_rows = self.staging_base + max_step_tokens
        windows, compressed, index_keys, compressor_states, indexer_states = [], {}, {}, {}, {}
        for layer, g in enumerate(geometry.layers):
            p = g.plan
            windows.append(_pool(window_rows, p.window_format, p.head_dim, p.packed, dtype, device))
            rows = num_pages * w // g.ratio + 1 if g.ratio else 0  # + the scratch row
            if g.compressor is not None:
                compressed[layer] = _pool(rows, p.compressed_format, p.head_dim, p.packed, dtype, device)
                compressor_states[layer] = compressor_state(g.compressor, slots, device)
            if g.index_pool:
                index_keys[layer] = _pool(rows, p.index_format, p.index_head_dim, p.packed, dtype, device)
            if g.indexer is not None:
                indexer_states[layer] = compressor_state(g.indexer, slots, device)
        # V4.1 Engram: [slots, n] int64, each sequence's last n token ids (reset to the pad id).
        self.token_history = None
        if geometry.plan.token_history:
            self.token_history = torch.full((slots, geometry.plan.token_history), geometry.plan.token_pad,
                                            dtype=torch.int64, device=self.device)
        # One view per layer; a layer reading another layer's pools (plan.kv_source) gets its source's.
        self._views = tuple(
            LayerCache(
                plan=g.plan, window=windows[layer],
                compressed=compressed.get(g.plan.kv_source), index_keys=index_keys.get(g.plan.kv_source),
                compressor_state=compressor_states.get(layer), indexer_state=indexer_states.get(layer),
            )
            for layer, g in enumerate(geometry.layers)
        )
        self._states = (*compressor_states.values(), *indexer_states.values())
        self._pools = (*windows, *compressed.values(), *index_keys.values())
        self._windows = windows
        # Automatic prefix caching (`enable_prefix_caching`): None while off.
        self.prefix: PrefixCache | None = None
        self.snapshots: SnapshotPool | None = None
        self._stateful: list[torch.Tensor] = []
        self._chain: dict[int, _Chain] = {}  # slot -> its registration progress and snapshot ends

    # ------------------------------------------------------------------ prefix caching
    def enable_prefix_caching(self, num_snapshots: int, chunk_grid: int | None = None) -> str | None:
        """Turn automatic prefix caching on (`cache/prefix_cache.py`) with a pool of
        `num_snapshots` page-end snapshots (`cache/snapshots.py`); returns why not, if not.

        `chunk_grid` (a multiple of the page size; default one page): prefill chunks end on
        multiples of it and snapshots are kept only there, so a hit resumes where a cold run of the
        same prompt also began a chunk, and computes every later chunk with the cold run's shapes
        (the same bits). The engine sets it to the step's token budget rounded down to whole
        pages: cold prompts prefill in full-budget chunks, and a hit is cut back to the grid (at
        most grid - page tokens shorter than the cached pages).

        A snapshot is the sequence's state at a page's end: the window ring (at a page boundary
        the ring holds exactly that page's W rows, in position order) and the overlapping
        compressors' previous block (kv and score, the first half rows and channels: all a
        position on a block boundary reads of the state). A non-overlapping compressor's open
        block is empty at a page boundary when its ratio divides W (required), so its online
        state is the reset state. Memory: `num_snapshots` slots of W window rows per layer plus
        those quarter states (the budget's "prefix snapshots" line, `cache/budget.py`)."""
        refused = prefix_caching_refusal(self.geometry)
        if refused:
            return refused
        if self.ring_size != self.page_size:  # snapshots read the ring as exactly one page of rows
            return "prefix caching is off with window rings longer than the window (speculative decoding)"
        w = self.page_size
        stateful = [p.data[:self.staging_base].view(self.padding_slot + 1, w, *p.data.shape[1:]) for p in self._windows]
        # Of an overlapping state only the previous block's first half channels are read at a page
        # boundary (the open block is empty; `model/compressor.py`, `ops/compress_decode*.py`).
        stateful += [t[:, :t.shape[1] // 2, :t.shape[2] // 2] for s in self._states if isinstance(s, CompressorState)
                     for t in s.tensors()]
        self._stateful = stateful
        grid = w if chunk_grid is None else chunk_grid
        if grid <= 0 or grid % w:
            raise ValueError(f"chunk_grid must be a positive multiple of the page size {w}, got {chunk_grid}")
        self.chunk_grid = grid
        self.snapshots = SnapshotPool(stateful, num_snapshots)
        self.prefix = PrefixCache(self.allocator, w)
        self.prefix.on_forget = self.snapshots.drop
        return None

    @property
    def snapshot_nbytes(self) -> int:
        return self.snapshots.nbytes if self.snapshots is not None else 0

    def match_prefix(self, token_ids: list[int]) -> PrefixHit:
        """The cached pages a new sequence of `token_ids` reuses: the longest run of registered
        pages that starts it and ends at a page with a snapshot (at least one token is left to
        compute: its logits are wanted); `shared`: how many registered pages matched in all."""
        if self.prefix is None:
            return PrefixHit([], 0, 0)
        chain, _ = self.prefix.match(token_ids, (len(token_ids) - 1) // self.page_size)
        k = len(chain)
        while k and chain[k - 1] not in self.snapshots:
            k -= 1
        return PrefixHit(chain[:k], self.prefix.node_of(chain[k - 1]) if k else ROOT, len(chain))

    def pages_to_admit(self, hit: PrefixHit, num_tokens: int) -> int:
        """Pages beyond the available ones a new sequence reusing `hit` needs for `num_tokens`
        tokens (<= 0: it fits)."""
        need = max(0, -(-num_tokens // self.page_size) - len(hit.pages))
        available = self.allocator.num_free
        if self.prefix is not None:
            available -= sum(1 for p in hit.pages if self.prefix.is_cached(p))  # they stop being evictable
        return need - available

    def attach_prefix(self, slot: int, hit: PrefixHit, num_tokens: int) -> None:
        """Give a freshly opened slot the cached pages of `hit` and the state at their end.
        `num_tokens`: the sequence's tokens now, all computed by prefill chunks from here; only
        pages within them are registered later (a page holding decoded tokens was computed by
        decode steps, whose numbers differ from the prefill a cold run of the same tokens does).

        Snapshot policy: the sequence keeps the state at the end of its last full prefilled page
        (where its next turn, this prompt plus the answer plus a new message, resumes), and, when
        its prompt matched registered pages past the hit's end (a prefix shared with an earlier
        sequence, with no snapshot where the sharing ends), the state at the end of the shared
        pages, so that the next sequence sharing them hits all of them."""
        if self.prefix is None:
            return
        if self._pages[slot]:
            raise RuntimeError(f"slot {slot} already holds pages")
        pages = hit.pages
        self._chain[slot] = _Chain(len(pages), hit.node, num_tokens, self.snapshot_ends(hit, num_tokens))
        if not pages:
            return
        self.prefix.acquire(pages)
        self._pages[slot] = list(pages)
        self.page_table[slot, :len(pages)] = torch.tensor(pages, dtype=torch.int64)
        self._update_row_tables(slot)
        self.snapshots.load(pages[-1], self._stateful, slot)

    def snapshot_ends(self, hit: PrefixHit, num_tokens: int) -> set[int]:
        """The token positions where a sequence admitted with `hit` and `num_tokens` tokens keeps a
        snapshot (attach_prefix's policy, on the chunk grid)."""
        if self.prefix is None:
            return set()
        g = self.chunk_grid
        return {num_tokens // g * g, hit.shared * self.page_size // g * g} - {0, len(hit.pages) * self.page_size}

    def snapshot_pages(self, ends: list[tuple[int, int]]) -> None:
        """After a step's forward (in stream order, before the next step): for each (slot, end)
        where the slot's policy wants a snapshot (`attach_prefix`), keep the slot's state as the
        snapshot of the page ending there."""
        if self.prefix is None:
            return
        w = self.page_size
        for slot, end in ends:
            pages, chain = self._pages.get(slot), self._chain.get(slot)
            if chain is None or end not in chain.snapshot_ends or pages is None or len(pages) < end // w:
                continue
            self.snapshots.save(pages[end // w - 1], self._stateful, slot)

    def register_pages(self, slot: int, num_computed: int, token_ids) -> None:
        """Register the slot's full pages among its first `num_computed` prefilled tokens under
        their prefix keys. `token_ids()`: the sequence's tokens (called only when needed). A page
        whose key another page holds stays private; its snapshot, if any, goes to that page."""
        if self.prefix is None or slot not in self._chain:
            return
        w, chain = self.page_size, self._chain[slot]
        pages = self._pages[slot]
        full = min(min(num_computed, chain.prefilled) // w, len(pages))
        if full <= chain.done:
            return
        tokens = token_ids()
        while chain.done < full:
            page = pages[chain.done]
            chain.node, registered = self.prefix.register(chain.node, tuple(tokens[chain.done * w:(chain.done + 1) * w]),
                                                          page)
            if registered != page:
                self.snapshots.move(page, registered)
            chain.done += 1

    def _allocate(self, n: int) -> list[int]:
        if self.prefix is None:
            return self.allocator.allocate(n)
        return self.prefix.allocate(n)

    def view(self, layer: int) -> LayerCache:
        """What layer `layer` reads and writes: its pools (or its source layer's), states and formats."""
        return self._views[layer]

    @property
    def nbytes(self) -> int:
        """Bytes of every pool and state tensor the cache allocated (the budget's `total_bytes`)."""
        tensors = [p.data for p in self._pools] + [t for s in self._states for t in s.tensors()]
        return sum(t.numel() * t.element_size() for t in tensors) + self.snapshot_nbytes

    # ------------------------------------------------------------------ sequences and pages
    @property
    def num_free_slots(self) -> int:
        return len(self._free_slots)

    def pages_needed(self, slot: int | None, num_tokens: int) -> int:
        """Extra pages a sequence needs to hold `num_tokens` tokens of history."""
        have = len(self._pages.get(slot, [])) if slot is not None else 0
        return max(0, -(-num_tokens // self.page_size) - have)

    def open_sequence(self) -> int:
        if not self._free_slots:
            raise RuntimeError("no free sequence slot")
        slot = self._free_slots.pop()
        self._pages[slot] = []
        for state in self._states:
            state.reset(slot)
        if self.token_history is not None:
            self.token_history[slot].fill_(self.plan.token_pad)
        return slot

    def reserve(self, slot: int, num_tokens: int) -> None:
        """Make sure the slot's page table covers positions [0, num_tokens)."""
        if num_tokens > self.page_table.shape[1] * self.page_size:
            raise ValueError(f"{num_tokens} tokens exceed the cache's maximum sequence length")
        pages = self._pages[slot]
        new = self._allocate(self.pages_needed(slot, num_tokens))
        if new:
            self.page_table[slot, len(pages):len(pages) + len(new)] = torch.tensor(new, dtype=torch.int64)
            self._update_row_tables(slot)
        pages.extend(new)

    def close_sequence(self, slot: int) -> None:
        """Free the slot and its pages at once (finished, aborted or preempted)."""
        pages = self._pages.pop(slot)
        self._chain.pop(slot, None)
        if self.prefix is not None:
            self.prefix.release(pages)
            for page in pages:  # a private page's snapshot (taken, key held by another page) goes with it
                if not self.prefix.is_registered(page):
                    self.snapshots.drop(page)
        else:
            self.allocator.free(pages)
        self.page_table[slot].fill_(-1)
        self._update_row_tables(slot)
        self._free_slots.append(slot)

    def _update_row_tables(self, slot: int) -> None:
        """Recompute the slot's compressed rows from its page-table row, on the host and the device."""
        for r, table in self.compressed_row_table.items():
            table[slot] = compressed_rows_of_pages(self.page_table[slot], r, self.page_size)
            device_table = self.device_compressed_row_table[r]
            if device_table is not table:
                device_table[slot].copy_(table[slot], non_blocking=True)

    # ------------------------------------------------------------------ step addressing
    def build_batch(
        self, chunks: list[SequenceChunk], token_ids: list[int], logits_indices: list[int]
    ) -> ForwardBatch:
        w, ring = self.page_size, self.ring_size
        positions = torch.cat([torch.arange(c.start, c.end) for c in chunks])
        columns, ring_src, ring_dst = [], [], []
        for c in chunks:
            pos = torch.arange(c.start, c.end)
            window = pos[:, None] - w + 1 + torch.arange(w)[None, :]  # [L, W] positions
            staged = self.staging_base + c.offset + (window - c.start)
            ringed = c.slot * ring + window % ring
            col = torch.where(window >= c.start, staged, ringed)
            columns.append(torch.where(window >= 0, col, -1))
            kept = torch.arange(max(c.start, c.end - w), c.end)
            ring_src.append(self.staging_base + c.offset + (kept - c.start))
            ring_dst.append(c.slot * ring + kept % ring)
        compressed_rows = {}
        for r, table in self.compressed_row_table.items():
            n_rows = max(c.end // r for c in chunks)
            t = torch.arange(n_rows)
            compressed_rows[r] = torch.stack([torch.where(t < c.end // r, table[c.slot, :n_rows], -1) for c in chunks])
        dev = self.device
        token_chunk = torch.cat([torch.full((c.length,), b, dtype=torch.int64) for b, c in enumerate(chunks)])
        return ForwardBatch(
            token_ids=torch.tensor(token_ids, dtype=torch.int64, device=dev),
            positions=positions.to(dev),
            chunks=tuple(chunks),
            window_columns=torch.cat(columns).to(device=dev, dtype=torch.int32),
            staging_rows=(self.staging_base + torch.arange(len(token_ids))).to(dev),
            ring_src=torch.cat(ring_src).to(dev),
            ring_dst=torch.cat(ring_dst).to(dev),
            compressed_rows={r: v.to(dev) for r, v in compressed_rows.items()},
            logits_indices=torch.tensor(logits_indices, dtype=torch.int64, device=dev),
            token_chunk=token_chunk.to(dev),
            slots=torch.tensor([c.slot for c in chunks], dtype=torch.int64, device=dev),
            tickets=self.tickets,
        )

    def build_decode_batch(
        self, token_ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
        route_rows: torch.Tensor | None = None,
    ) -> ForwardBatch:
        """One token per sequence, addressed on the device from device tensors (no host work, no
        host sync: the CUDA-graph runner captures this). The token's KV row goes straight to its
        ring slot (position % ring_size): for a single token that slot holds a row already out of
        its window.
        `route_rows`: see ForwardBatch."""
        window = positions[:, None] + self._window_offsets  # [B, W] positions p-W+1 .. p
        ring = slots[:, None] * self.ring_size + window % self.ring_size
        n = token_ids.shape[0]
        empty = torch.empty(0, dtype=torch.int64, device=positions.device)
        every = self._row_index[:n]
        return ForwardBatch(
            token_ids=token_ids,
            positions=positions,
            chunks=(),
            window_columns=torch.where(window >= 0, ring, -1).to(torch.int32),
            staging_rows=ring[:, -1].contiguous(),  # the ring row of position p (one copy, not one a layer)
            ring_src=empty,
            ring_dst=empty,
            compressed_rows={r: table[slots] for r, table in self.device_compressed_row_table.items()},
            logits_indices=every,
            token_chunk=every,
            slots=slots,
            tickets=self.tickets,
            is_decode=True,
            route_rows=route_rows,
        )

    def build_verify_batch(
        self, token_ids: torch.Tensor, starts: torch.Tensor, slots: torch.Tensor, groups: int,
        route_rows: torch.Tensor | None = None, checkpoints=None,
    ) -> ForwardBatch:
        """`groups` tokens per sequence at consecutive positions (a speculative verify step: the last
        token and its drafts), addressed on the device like a decode step (CUDA-graph safe).

        Tokens are group-major: token `j * S + b` is sequence b's token at position starts[b] + j
        (S = len(slots)), so group j is one token per sequence, the shape of a decode step. Every
        token writes its KV row straight to its ring row and attends over its own window: a ring of
        `ring_size >= W + groups - 1` rows keeps every row a token of the step reads in place while
        the later tokens of its sequence write theirs, and rows written past what the step finally
        keeps never displace a row a later step reads. Compressors fold the groups in order
        (`verify_groups`), saving each sequence's state after every group in `checkpoints`
        (`cache/state_checkpoints.py`), from which the accepted prefix's state is restored."""
        if groups - 1 > self.ring_size - self.page_size:
            raise ValueError(f"a verify step of {groups} tokens per sequence needs window rings of >= "
                             f"{self.page_size + groups - 1} rows; this cache's hold {self.ring_size}")
        offsets = self._verify_offsets.get(groups)
        if offsets is None:
            offsets = self._verify_offsets[groups] = torch.arange(groups, device=self.device)
        positions = (starts[None, :] + offsets[:, None]).reshape(-1)
        batch = self.build_decode_batch(token_ids, positions, slots.repeat(groups), route_rows)
        batch.verify_groups = groups
        batch.checkpoints = checkpoints
        return batch


def prefix_caching_refusal(geometry: CacheGeometry) -> str | None:
    """Why a cache of this geometry cannot cache prefixes (None: it can)."""
    if geometry.plan.token_history or any(p.v41 for p in geometry.plan):
        return "prefix caching is off for DeepSeek-V4.1 models (their pools are shared across layers)"
    if any(geometry.page_size % r for r in geometry.ratios):
        return (f"prefix caching is off: the compress ratios {geometry.ratios} must divide the page size "
                f"{geometry.page_size}")
    return None


def compressed_rows_of_pages(pages: torch.Tensor, ratio: int, page_size: int) -> torch.Tensor:
    """int32 [..., P * page_size // ratio]: the pool row of compressed row t for page-table rows
    `pages` [..., P] (`cache/batch.py`: page(t * ratio // W) * (W // ratio) + t % (W // ratio)),
    -1 where the page is not allocated."""
    per_page = page_size // ratio
    t = torch.arange(pages.shape[-1] * per_page)
    page = pages[..., t // per_page]
    return torch.where(page >= 0, page * per_page + t % per_page, -1).to(torch.int32)
