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
    # V4.1: the kv-source layer whose compressed and index pools this layer reads (None: its own).
    source: int | None = None
    index_keys: bool = False  # V4.1 kv source: an index-key pool (keys from the main latent, no state)


@dataclass(frozen=True)
class CacheGeometry:
    page_size: int
    head_dim: int
    index_head_dim: int
    layers: tuple[LayerGeometry, ...]
    # V4.1 Engram: each sequence's last `token_history` token ids (`token_pad` before the start).
    token_history: int = 0
    token_pad: int = 0

    @classmethod
    def from_config(cls, config: ModelConfig) -> "CacheGeometry":
        if config.v41 is not None:
            return cls._from_v41(config)
        layers = []
        for kind, ratio in zip(config.layer_types, config.compress_ratios):
            overlap = kind == CSA
            compressor = CompressorShape(ratio, config.head_dim, overlap) if ratio else None
            indexer = CompressorShape(ratio, config.index_head_dim, True) if kind == CSA else None
            layers.append(LayerGeometry(ratio, compressor, indexer))
        return cls(config.sliding_window, config.head_dim, config.index_head_dim, tuple(layers))

    @classmethod
    def _from_v41(cls, config: ModelConfig) -> "CacheGeometry":
        """DeepSeek-V4.1: only kv-source layers own compressed / index pools (and, ratio 2, an
        online pooling state); every other compressed layer reads its source's (`source`)."""
        layers = []
        for layer, ratio in enumerate(config.compress_ratios):
            src = config.v41.kv_source(layer)
            if src == layer:
                layers.append(LayerGeometry(ratio, CompressorShape(ratio, config.head_dim, False), None,
                                            index_keys=True))
            else:
                layers.append(LayerGeometry(ratio, None, None, source=src))
        v = config.v41
        history = v.engram_max_ngram_size - 1 if v.engram_layer_ids else 0
        return cls(config.sliding_window, config.head_dim, config.index_head_dim, tuple(layers),
                   token_history=history, token_pad=v.engram_pad_token_id)

    @property
    def ratios(self) -> tuple[int, ...]:
        """The distinct compress ratios in use (each gets its own row addressing)."""
        return tuple(sorted({g.ratio for g in self.layers if g.ratio}))
