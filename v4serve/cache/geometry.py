"""Pool geometry derived from the layer plans (`v4serve/layer_plan.py`) in one place, with the bytes
each tier costs.

Tiers, per layer:
* window rows: `sliding_window` rows of `head_dim` per sequence (a ring; does not grow);
* compressed rows (ratio r > 0): one `head_dim` row per r tokens of history, paged;
* index keys (CSA layers): one `index_head_dim` row per r tokens, paged like the compressed rows;
* compressor state (partial blocks, ratio r > 0), per sequence: fp32 kv + score rows of the open
  and the previous block for overlapping (CSA) compressors; an online softmax of the open block
  (three vectors) for the others.

A row takes `RowFormat.row_bytes(dim)` bytes in a packed cache, else `dim` values of the model's
dtype. A layer that reads another layer's pools (`LayerPlan.kv_source`) owns none of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from v4serve.config import ModelConfig
from v4serve.formats import CACHE_FORMATS, CacheFormat, RowFormat
from v4serve.layer_plan import IndexerMode, LayerPlan, ModelPlan, layer_plans


@dataclass(frozen=True)
class CompressorShape:
    ratio: int
    head_dim: int
    overlap: bool

    @property
    def state_rows(self) -> int:
        return 2 * self.ratio

    @property
    def state_width(self) -> int:
        return 2 * self.head_dim

    @property
    def state_bytes(self) -> int:
        """Per sequence: the raw fp32 kv + score rows of two blocks with overlap, else three fp32
        vectors of an online softmax (kv_cache.CompressorState / OnlinePoolState)."""
        if self.overlap:
            return 2 * self.state_rows * self.state_width * 4
        return 3 * self.head_dim * 4


@dataclass(frozen=True)
class LayerGeometry:
    plan: LayerPlan

    @property
    def ratio(self) -> int:  # 0: window only
        return self.plan.ratio

    @property
    def compressor(self) -> CompressorShape | None:
        p = self.plan
        return CompressorShape(p.ratio, p.head_dim, p.overlap) if p.compressed and p.owns_pools else None

    @property
    def indexer(self) -> CompressorShape | None:
        p = self.plan
        own = p.indexer is IndexerMode.OWN and p.owns_pools
        return CompressorShape(p.ratio, p.index_head_dim, True) if own else None


def stored_row_bytes(fmt: RowFormat, dim: int, packed: bool, element_size: int) -> int:
    """Bytes a pool row of `dim` channels takes: the format's packed row, or `dim` values."""
    return fmt.row_bytes(dim) if packed and fmt.packed else dim * element_size


@dataclass(frozen=True)
class CacheGeometry:
    page_size: int
    head_dim: int
    index_head_dim: int
    layers: tuple[LayerGeometry, ...]
    plan: ModelPlan

    @classmethod
    def from_config(cls, config: ModelConfig, cache: CacheFormat = CACHE_FORMATS["bf16"],
                    packed: bool | None = None) -> "CacheGeometry":
        return cls.from_plan(layer_plans(config, cache, packed), config.page_size)

    @classmethod
    def from_plan(cls, plan: ModelPlan, page_size: int) -> "CacheGeometry":
        first = plan.layers[0]
        return cls(page_size, first.head_dim, first.index_head_dim, tuple(LayerGeometry(p) for p in plan), plan)

    @property
    def ratios(self) -> tuple[int, ...]:
        """The distinct compress ratios in use (each gets its own row addressing)."""
        return self.plan.ratios

    def row_bytes(self, element_size: int) -> list[dict[str, int]]:
        """Per layer, the bytes of one row of each pool the layer owns ("window", "compressed",
        "index"), for pools of unpacked rows in a dtype of `element_size` bytes."""
        out = []
        for g in self.layers:
            p, rows = g.plan, {}
            rows["window"] = stored_row_bytes(p.window_format, p.head_dim, p.packed, element_size)
            if g.compressor is not None:
                rows["compressed"] = stored_row_bytes(p.compressed_format, p.head_dim, p.packed, element_size)
            if g.indexer is not None:
                rows["index"] = stored_row_bytes(p.index_format, p.index_head_dim, p.packed, element_size)
            out.append(rows)
        return out
