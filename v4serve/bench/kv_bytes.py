"""KV bytes per token of a built cache, three ways, and whether they agree.

* pools: what `PagedKVCache` allocated, per paged tier `pool.data.nbytes / rows / ratio` summed over
  the pools a layer owns (a V4.1 layer reading its kv source's pools owns none);
* formats: per owned tier `RowFormat.row_bytes(dim)` (packed) or `dim` values of the cache's
  dtype, divided by the layer's ratio: the layer plan and the row formats alone;
* budget: `KVBudget.bytes_per_token`, what the memory solver spent pages on.

Window rings cost bytes per sequence, not per token: their row bytes are listed with the rest.
`python -m v4serve.bench.engine` prints `kv_bytes_lines` at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass

from v4serve.cache import PagedKVCache
from v4serve.cache.budget import KVBudget

TIERS = ("window", "compressed", "index keys")


@dataclass(frozen=True)
class TierRows:
    """One tier of one layer: its format, its row bytes in the pool and by the format, its ratio."""

    tier: str
    layer: int
    format_name: str
    pool_row_bytes: int
    format_row_bytes: int
    ratio: int


def owned_tiers(cache: PagedKVCache) -> list[TierRows]:
    """Every pool a layer owns (window rings of every layer; compressed rows and index keys of the
    layers whose plan owns them), with its row bytes measured and by the format."""
    size = cache.dtype.itemsize
    out = []
    for layer in range(len(cache.plan)):
        view = cache.view(layer)
        p = view.plan
        pools = [("window", view.window, p.window_format, p.head_dim)]
        if p.owns_pools and p.ratio:
            pools += [("compressed", view.compressed, p.compressed_format, p.head_dim),
                      ("index keys", view.index_keys, p.index_format, p.index_head_dim)]
        for tier, pool, fmt, dim in pools:
            if pool is None:
                continue
            by_format = fmt.row_bytes(dim) if p.packed and fmt.packed else dim * size
            out.append(TierRows(tier, layer, fmt.name, pool.data.nbytes // pool.num_rows, by_format, p.ratio))
    return out


def per_token(rows: list[TierRows], measured: bool) -> float:
    """Bytes per token of history of the paged tiers (pool row bytes, or the formats')."""
    return sum((r.pool_row_bytes if measured else r.format_row_bytes) / r.ratio for r in rows if r.tier != "window")


def kv_bytes_lines(cache: PagedKVCache, budget: KVBudget) -> tuple[list[str], bool]:
    """Start-up lines (the rows of each tier: format, bytes in the pool / by the format, layers)
    and whether pools, formats and budget agree on the bytes per token and every row."""
    rows = owned_tiers(cache)
    lines = ["KV rows (bytes per row, pool / format):"]
    for tier in TIERS:
        groups: dict[tuple, list[int]] = {}
        for r in rows:
            if r.tier == tier:  # window rings of every ratio together
                ratio = r.ratio if tier != "window" else 0
                groups.setdefault((r.format_name, r.pool_row_bytes, r.format_row_bytes, ratio), []).append(r.layer)
        for (name, pool, fmt, ratio), layers in groups.items():
            where = f"ratio {ratio}, " if tier != "window" else ""
            lines.append(f"  {tier:<11} {name:<20} {pool:>5} / {fmt:<5} B  ({where}{len(layers)} layers: "
                         f"{', '.join(map(str, layers))})")
    pools, formats = per_token(rows, True), per_token(rows, False)
    ok = all(r.pool_row_bytes == r.format_row_bytes for r in rows) and pools == formats == budget.bytes_per_token
    lines.append(f"KV bytes per token: pools {pools:.2f}, formats {formats:.2f}, budget {budget.bytes_per_token:.2f}: "
                 + ("agree" if ok else "MISMATCH"))
    return lines, ok
