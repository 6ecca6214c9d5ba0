"""The KV memory budget: how many pages a byte budget buys, and what each tier costs.

Paged tiers (compressed rows, index keys) cost bytes per token of history; fixed tiers (the
window ring, the compressor state) cost bytes per running sequence whatever its length; the
staging rows cost bytes per token of a step; with prefix caching, a pool of page-end snapshots
(`cache/snapshots.py`) costs a fixed number of slots, sized from `prefix_snapshot_fraction` of
the budget (at least one per sequence slot) unless `num_prefix_snapshots` is given. The solver
subtracts the fixed costs from the budget and spends the rest on pages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from v4serve.cache.geometry import CacheGeometry

# Share of free GPU memory the KV cache may take when no explicit budget is given.
GPU_MEMORY_FRACTION = 0.85
# Share of the KV budget the prefix snapshots take by default (`EngineArgs.prefix_snapshot_fraction`).
PREFIX_SNAPSHOT_FRACTION = 0.1


@dataclass(frozen=True)
class KVBudget:
    """The solved budget; every byte count is exact for the pools `PagedKVCache` allocates."""

    num_pages: int
    page_size: int  # tokens per page
    max_num_seqs: int
    max_pages_per_seq: int
    tier_bytes_per_token: dict[str, float]  # paged tiers
    tier_bytes_per_sequence: dict[str, int]  # fixed tiers, per running sequence
    staging_bytes: int  # per-step rows, fixed
    reserved_bytes: int  # decode's padding slot and the pools' scratch rows (kv_cache.py), fixed
    snapshot_slots: int = 0  # prefix caching's page-end snapshots (0: prefix caching off)
    snapshot_slot_bytes: int = 0  # bytes of one snapshot (`snapshot_slot_bytes`)

    @property
    def snapshot_bytes(self) -> int:
        return self.snapshot_slots * self.snapshot_slot_bytes

    @property
    def bytes_per_token(self) -> float:
        return sum(self.tier_bytes_per_token.values())

    @property
    def bytes_per_sequence(self) -> int:
        return sum(self.tier_bytes_per_sequence.values())

    @property
    def total_bytes(self) -> int:
        paged = self.bytes_per_token * self.page_size * self.num_pages
        return (int(paged) + self.bytes_per_sequence * self.max_num_seqs + self.staging_bytes + self.reserved_bytes
                + self.snapshot_bytes)

    @property
    def full_length_sequences(self) -> int:
        """Sequences of the maximum length that fit in the pages at once."""
        return self.num_pages // self.max_pages_per_seq

    @property
    def num_tokens(self) -> int:
        """Tokens of history the pages hold (vLLM's "KV cache size")."""
        return self.num_pages * self.page_size

    def max_concurrency(self, tokens_per_request: int) -> float:
        """Requests of `tokens_per_request` tokens whose pages fit at once (vLLM's "Maximum
        concurrency"; exact in pages: a request holds whole pages)."""
        return self.num_pages / -(-tokens_per_request // self.page_size)

    def describe(self, max_model_len: int | None = None) -> list[str]:
        """Human-readable lines for the start-up banner: vLLM's two lines, then every tier."""
        full_length = max_model_len or self.max_pages_per_seq * self.page_size
        lines = [
            f"KV cache size: {self.num_tokens} tokens",
            f"Maximum concurrency for {full_length} tokens per request: {self.max_concurrency(full_length):.2f}x",
            "KV cache budget:",
        ]
        for tier, b in self.tier_bytes_per_token.items():
            lines.append(f"  {tier:<22} {b:>12.1f} bytes/token")
        for tier, b in self.tier_bytes_per_sequence.items():
            lines.append(f"  {tier:<22} {b:>12d} bytes/sequence ({b / full_length:.1f} bytes/token at {full_length} tokens)")
        lines.append(f"  {'staging rows':<22} {self.staging_bytes:>12d} bytes")
        if self.snapshot_slots:
            lines.append(
                f"  {'prefix snapshots':<22} {self.snapshot_bytes:>12d} bytes ({self.snapshot_slots} slots of "
                f"{self.snapshot_slot_bytes} bytes, {self.snapshot_bytes / 2**20:.1f} MiB, "
                f"{self.snapshot_bytes / max(self.total_bytes, 1):.1%} of the KV cache)"
            )
        lines.append(
            f"  {self.num_pages} pages of {self.page_size} tokens ({self.num_pages * self.page_size} tokens, "
            f"{self.total_bytes / 2**20:.1f} MiB); {self.max_num_seqs} sequence slots; "
            f"{self.full_length_sequences} sequences of the maximum length fit at once"
        )
        return lines


def tier_costs(geometry: CacheGeometry, kv_dtype: torch.dtype) -> tuple[dict[str, float], dict[str, int], int, int]:
    """(paged bytes per token, fixed bytes per sequence, staging bytes per step token) by tier, and
    the reserved bytes: one padding slot's fixed tiers plus one scratch row per paged pool. Rows
    cost what the pools store: packed bytes in a packed cache (`CacheGeometry.row_bytes`)."""
    size = torch.empty((), dtype=kv_dtype).element_size()
    per_token = {"compressed rows": 0.0, "index keys": 0.0}
    per_seq = {"window ring": 0, "compressor state": 0}
    staging = scratch = 0
    for g, rows in zip(geometry.layers, geometry.row_bytes(size)):
        per_seq["window ring"] += geometry.page_size * rows["window"]
        staging += rows["window"]
        if "compressed" in rows:
            per_token["compressed rows"] += rows["compressed"] / g.ratio
            scratch += rows["compressed"]
        if "index" in rows:
            per_token["index keys"] += rows["index"] / g.ratio
            scratch += rows["index"]
        for c in (g.compressor, g.indexer):
            if c is not None:
                per_seq["compressor state"] += c.state_bytes
    return per_token, per_seq, staging, sum(per_seq.values()) + scratch


def snapshot_slot_bytes(geometry: CacheGeometry, kv_dtype: torch.dtype) -> int:
    """Bytes of one page-end snapshot (`cache/snapshots.py`): per layer W window rows, plus a
    quarter of each overlapping compressor's state (its previous block, half rows, half channels)."""
    size = torch.empty((), dtype=kv_dtype).element_size()
    total = 0
    for g, rows in zip(geometry.layers, geometry.row_bytes(size)):
        total += geometry.page_size * rows["window"]
        total += sum(c.state_bytes // 4 for c in (g.compressor, g.indexer) if c is not None and c.overlap)
    return total


@dataclass(frozen=True)
class SnapshotSizing:
    """How many prefix snapshots to keep: `count` when given, else `fraction` of the KV budget's
    bytes, at least `min_count` (one per sequence slot: every running sequence can leave one)."""

    fraction: float = PREFIX_SNAPSHOT_FRACTION
    count: int | None = None
    min_count: int = 1

    def __post_init__(self):
        if not 0 <= self.fraction < 1:
            raise ValueError(f"prefix_snapshot_fraction must be in [0, 1), got {self.fraction}")
        if self.count is not None and self.count < 1:
            raise ValueError(f"num_prefix_snapshots must be >= 1, got {self.count}")

    def slots(self, budget_bytes: float, slot_bytes: int) -> int:
        if self.count is not None:
            return self.count
        return max(self.min_count, int(self.fraction * budget_bytes // slot_bytes))


def solve_kv_budget(
    geometry: CacheGeometry,
    kv_dtype: torch.dtype,
    memory_bytes: int,
    max_num_seqs: int,
    max_pages_per_seq: int,
    max_step_tokens: int,
    snapshots: SnapshotSizing | None = None,
    source: str = "kv_cache_memory",
) -> KVBudget:
    """Pages that `memory_bytes` buys after the fixed costs of `max_num_seqs` sequences (and of
    the prefix snapshots, when `snapshots` is given: prefix caching on).

    Never more pages than `max_num_seqs` full-length sequences can use. Raises ValueError when
    the budget does not cover the fixed costs plus one page, naming `source` (where the budget came from)."""
    per_token, per_seq, staging_per_token, reserved = tier_costs(geometry, kv_dtype)
    slot_bytes = snapshot_slot_bytes(geometry, kv_dtype) if snapshots is not None else 0
    slots = snapshots.slots(memory_bytes, slot_bytes) if snapshots is not None else 0
    fixed = max_num_seqs * sum(per_seq.values()) + max_step_tokens * staging_per_token + reserved + slots * slot_bytes
    page_bytes = sum(per_token.values()) * geometry.page_size
    left = memory_bytes - fixed
    num_pages = int(left // page_bytes) if page_bytes else max_num_seqs * max_pages_per_seq
    num_pages = min(num_pages, max_num_seqs * max_pages_per_seq)
    if num_pages < 1:
        raise ValueError(
            f"{source}: {memory_bytes} bytes do not cover the fixed KV costs ({fixed} bytes for "
            f"{max_num_seqs} sequences{f' and {slots} prefix snapshots' if slots else ''}) plus one page "
            f"({page_bytes:.0f} bytes)"
        )
    return KVBudget(num_pages, geometry.page_size, max_num_seqs, max_pages_per_seq, per_token, per_seq,
                    max_step_tokens * staging_per_token, reserved, slots, slot_bytes)


def budget_for_pages(
    geometry: CacheGeometry, kv_dtype: torch.dtype, num_pages: int, max_num_seqs: int, max_pages_per_seq: int,
    max_step_tokens: int, snapshots: SnapshotSizing | None = None,
) -> KVBudget:
    """The budget of a given page count (to describe a cache sized by pages, not bytes). The
    snapshots' fraction is then of a budget that would hold these pages beside them."""
    per_token, per_seq, staging_per_token, reserved = tier_costs(geometry, kv_dtype)
    slot_bytes = slots = 0
    if snapshots is not None:
        slot_bytes = snapshot_slot_bytes(geometry, kv_dtype)
        paged = sum(per_token.values()) * geometry.page_size * num_pages
        slots = snapshots.slots(paged / (1 - snapshots.fraction), slot_bytes)
    return KVBudget(num_pages, geometry.page_size, max_num_seqs, max_pages_per_seq, per_token, per_seq,
                    max_step_tokens * staging_per_token, reserved, slots, slot_bytes)


def _allowance(free: int, total: int, utilization: float | None) -> int:
    return free if utilization is None else min(free, int(utilization * total) - (total - free))


def memory_allowance(device: torch.device, utilization: float | None = None) -> int:
    """Bytes this engine may still allocate on the device: all of its free memory, or with
    `gpu_memory_utilization` u (vLLM's rule), u x its total memory less all memory in use on it
    (this engine's weights so far, other processes)."""
    return _allowance(*torch.cuda.mem_get_info(device), utilization)


def default_kv_memory(device: torch.device, utilization: float | None = None) -> tuple[int, str]:
    """(bytes, where they come from) of the KV cache when no budget is given, once the weights are
    on the device: `memory_allowance` less a headroom of 1 - GPU_MEMORY_FRACTION of the free memory
    (activations, CUDA graphs, workspaces); with utilization None, GPU_MEMORY_FRACTION of the free memory."""
    free, total = torch.cuda.mem_get_info(device)
    memory = _allowance(free, total, utilization) - int(free * (1 - GPU_MEMORY_FRACTION))
    gib = 2**30
    if utilization is None:
        return memory, f"free GPU memory ({GPU_MEMORY_FRACTION:.0%} of {free / gib:.2f} GiB free after loading the model)"
    return memory, (f"gpu_memory_utilization {utilization}: {utilization * total / gib:.2f} GiB of the GPU's "
                    f"{total / gib:.2f} GiB, {(total - free) / gib:.2f} GiB in use after loading the model, "
                    f"{free * (1 - GPU_MEMORY_FRACTION) / gib:.2f} GiB kept for activations")


def parse_size(text: str | int) -> int:
    """Bytes from `123`, `512MiB`, `2GiB`, `1.5GB`, `64k` (binary units for *iB and bare letters)."""
    if isinstance(text, int):
        return text
    units = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
             "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}
    s = text.strip().lower()
    number = s.rstrip("abgikmt")
    unit = s[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value < 0:
        raise ValueError(f"{text!r} is not a size such as 2GiB, 512MiB or 1073741824")
    return int(value * units[unit])
