"""Pool geometry derived from the model config in one place, with the bytes each tier costs.

Tiers, per layer:
* window rows: `sliding_window` rows of `head_dim` per sequence (a ring; does not grow);
* compressed rows (ratio r > 0): one `head_dim` row per r tokens of history, paged;
* index keys (CSA layers): one `index_head_dim` row per r tokens, paged like the compressed rows;
* compressor state (partial blocks, ratio r > 0), per sequence: fp32 kv + score rows of the open
  and the previous block for overlapping (CSA) compressors; an online softmax of the open block
  (three vectors) for the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from v4serve.config import CSA, ModelConfig


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
    ratio: int  # 0: window only
    compressor: CompressorShape | None
    indexer: CompressorShape | None


@dataclass(frozen=True)
class CacheGeometry:
    page_size: int
    head_dim: int
    index_head_dim: int
    layers: tuple[LayerGeometry, ...]

    @classmethod
    def from_config(cls, config: ModelConfig) -> "CacheGeometry":
        layers = []
        for kind, ratio in zip(config.layer_types, config.compress_ratios):
            overlap = kind == CSA
            compressor = CompressorShape(ratio, config.head_dim, overlap) if ratio else None
            indexer = CompressorShape(ratio, config.index_head_dim, True) if kind == CSA else None
            layers.append(LayerGeometry(ratio, compressor, indexer))
        return cls(config.sliding_window, config.head_dim, config.index_head_dim, tuple(layers))

    @property
    def ratios(self) -> tuple[int, ...]:
        """The distinct compress ratios in use (each gets its own row addressing)."""
        return tuple(sorted({g.ratio for g in self.layers if g.ratio}))
