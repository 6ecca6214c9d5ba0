"""One declared plan per layer: everything that differs between a model's attention layers.

Built once from the `ModelConfig` and a `CacheFormat` (`kv_cache_dtype`) by `layer_plans`; the
model (`model/attention.py`, `compressor.py`, `indexer.py`) builds its modules from it and the
cache (`cache/geometry.py`, `kv_cache.py`, `budget.py`) its pools. Nothing else reads a layer's
role from `config.layer_types` / `config.compress_ratios`.

Per layer:
* `ratio`: tokens per compressed row (0: window only);
* `compressor`: none / overlapping (ratio 4, CSA: each row pools 2 * ratio candidates, the
  previous block's first half and its own block's second half) / plain (HCA: one block);
* `indexer`: none / own (V4 CSA: an index-key compressor of its own and a top-k over its keys);
  V4.1 adds full (scores every visible row), reindex (re-scores a source layer's candidates) and
  reuse (takes a source layer's picks);
* `kv_source`: the layer whose pools it reads (itself in V4; a V4.1 Reindex / Reuse layer reads
  its source's compressed and index pools);
* `lagged_hc`: the block's mHC wiring: V4 collapses each sublayer's input with its own `pre`;
  V4.1 with the `pre` the previous sublayer computed (one-hot for the first block's attention);
* `engram_table`: which of the model's Engram tables (V4.1, `model/engram.py`; their order in
  `engram_layer_ids`) adds its hashed n-gram embeddings to the streams before this layer (None: none);
* `q_head_rms`: V4's weightless per-head RMS of the queries (V4.1 has none);
* the `RowFormat` of each tier: window rows, compressed rows, index keys (None where the layer
  has no such tier), and `packed`: whether pools store the formats' packed bytes
  (`RowFormat.row_bytes` per row) or rows of `dim` channels in the model's dtype.

Dimensions of the rows: window and compressed rows have `head_dim` channels, index keys
`index_head_dim`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from v4serve.config import CSA, HCA, SLIDING, ModelConfig
from v4serve.formats import CACHE_FORMATS, CacheFormat, RowFormat, cache_format, row_format


class CompressorKind(enum.Enum):
    NONE = "none"
    OVERLAPPING = "overlapping"  # CSA: ratio 4, 2 * ratio candidates per row
    PLAIN = "plain"  # HCA: one block per row, folded online (also V4.1's ratio-2 kv sources, no ape)
    GATELESS = "gateless"  # V4.1 ratio 1: each token's normalised latent is its row


class IndexerMode(enum.Enum):
    NONE = "none"
    OWN = "own"  # V4: own index keys, own top-k
    FULL = "full"  # V4.1 kv source: index keys from its latent, scores every visible row
    REINDEX = "reindex"  # V4.1: own queries over the source's keys (candidate-restricted after the candidate source)
    REUSE = "reuse"  # V4.1: the top-k published last in the step


V41_INDEXER_MODES = (IndexerMode.FULL, IndexerMode.REINDEX, IndexerMode.REUSE)


@dataclass(frozen=True)
class LayerPlan:
    layer: int
    ratio: int
    compressor: CompressorKind
    indexer: IndexerMode
    kv_source: int
    head_dim: int
    index_head_dim: int
    window_format: RowFormat
    compressed_format: RowFormat | None
    index_format: RowFormat | None
    packed: bool = False
    q_head_rms: bool = True  # V4's weightless per-head RMS of q (V4.1 has none)
    # V4.1 candidate selection: this layer publishes the candidate mask (the candidate source) /
    # scores only the published candidates (a reindex layer after it).
    publishes_candidates: bool = False
    candidate_restricted: bool = False
    lagged_hc: bool = False
    engram_table: int | None = None

    @property
    def compressed(self) -> bool:
        return self.compressor is not CompressorKind.NONE

    @property
    def overlap(self) -> bool:
        return self.compressor is CompressorKind.OVERLAPPING

    @property
    def indexed(self) -> bool:
        return self.indexer is not IndexerMode.NONE

    @property
    def owns_pools(self) -> bool:
        """Whether the layer has compressed / index pools of its own (False: it reads its source's)."""
        return self.kv_source == self.layer

    @property
    def index_rotated(self) -> bool:
        """Index queries and keys go through a Hadamard rotation before their (quantized) format
        (V4's own indexer; V4.1 rounds them unrotated)."""
        return self.indexer is IndexerMode.OWN and self.index_format is not None and self.index_format.name != "bf16"

    @property
    def v41(self) -> bool:
        return self.indexer in V41_INDEXER_MODES

    @property
    def index_pool(self) -> bool:
        """The layer owns an index-key pool (V4 CSA, V4.1 kv sources)."""
        return self.indexer in (IndexerMode.OWN, IndexerMode.FULL) and self.owns_pools


@dataclass(frozen=True)
class ModelPlan:
    """The layer plans of a model and the cache format they were built for, and how the model
    closes: V4 collapses the final streams with its own `hc_head` and runs the head in the model
    dtype; V4.1 (lagged mHC) collapses them with the last block's ffn `pre` and runs the head in fp32."""

    cache_format: CacheFormat
    layers: tuple[LayerPlan, ...]
    hc_head: bool = True
    fp32_head: bool = False
    # V4.1 Engram: the cache keeps each sequence's last `token_history` token ids (`token_pad` first).
    token_history: int = 0
    token_pad: int = 0

    def __getitem__(self, layer: int) -> LayerPlan:
        return self.layers[layer]

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    @property
    def ratios(self) -> tuple[int, ...]:
        """The distinct compress ratios in use (each gets its own row addressing)."""
        return tuple(sorted({p.ratio for p in self.layers if p.ratio}))


_KINDS = {SLIDING: (CompressorKind.NONE, IndexerMode.NONE), CSA: (CompressorKind.OVERLAPPING, IndexerMode.OWN),
          HCA: (CompressorKind.PLAIN, IndexerMode.NONE)}


def native_formats_fit(config: ModelConfig, cache: CacheFormat) -> bool:
    """Whether `cache`'s row formats describe rows of this model: the KV format's bf16 tail is
    the model's RoPE part and both formats' blocks divide the quantized channels (the official
    V4 geometry: 448 + 64 KV channels, 128 index channels)."""
    kv, index = row_format(cache.kv_rows), row_format(cache.index_rows)
    try:
        kv.row_bytes(config.head_dim), index.row_bytes(config.index_head_dim)
    except ValueError:
        return False
    return kv.plain_tail in (0, config.qk_rope_head_dim) and config.head_dim > kv.plain_tail


def resolve_cache_format(config: ModelConfig, name: str | None, device_type: str) -> tuple[CacheFormat, str | None]:
    """The cache format for `kv_cache_dtype` = `name` on this model, and why it is not the one
    asked for (None when it is): "auto" means the model's native formats, and a model whose rows
    they do not describe (the `tiny` preset: head_dim 64 with 16 RoPE channels) has none, so it
    stores bf16 rows."""
    if config.v41 is not None:  # V4.1's native formats on any device (layer_plans picks its row formats)
        return cache_format(name or "auto", device_type), None
    cache = cache_format(name, device_type)
    if cache.quantized and not native_formats_fit(config, cache):
        reason = (f"kv_cache_dtype {cache.name!r}: the native formats ({cache.kv_rows}, {cache.index_rows}) do not "
                  f"fit head_dim {config.head_dim} / qk_rope_head_dim {config.qk_rope_head_dim} / index_head_dim "
                  f"{config.index_head_dim}; storing bf16 rows")
        return CACHE_FORMATS["bf16"], reason
    return cache, None


def _checked(name: str, dim: int, field: str) -> RowFormat:
    fmt = row_format(name)
    try:
        fmt.row_bytes(dim)
    except ValueError as e:
        raise ValueError(f"kv_cache_dtype: {e} (config field `{field}` = {dim})") from None
    return fmt


def layer_plans(config: ModelConfig, cache: CacheFormat = CACHE_FORMATS["bf16"], packed: bool | None = None
                ) -> ModelPlan:
    """The plan of every layer of `config` for a cache storing `cache`'s formats. `packed`: pools
    hold the formats' packed bytes (the default for a quantized `cache`); False keeps rows of the
    model's dtype, rounded through the formats (the same numerics, bf16's memory)."""
    if config.v41 is not None:
        return _v41_plans(config, cache, packed)
    kv = _checked(cache.kv_rows, config.head_dim, "head_dim")
    plans = []
    for layer, (kind, ratio) in enumerate(zip(config.layer_types, config.compress_ratios)):
        compressor, indexer = _KINDS[kind]
        index = _checked(cache.index_rows, config.index_head_dim, "index_head_dim") if indexer is not IndexerMode.NONE else None
        plans.append(LayerPlan(
            layer=layer, ratio=ratio, compressor=compressor, indexer=indexer, kv_source=layer,
            head_dim=config.head_dim, index_head_dim=config.index_head_dim, window_format=kv,
            compressed_format=kv if ratio else None, index_format=index, packed=cache.quantized if packed is None else packed and cache.quantized,
        ))
    return ModelPlan(cache, tuple(plans))


# ---------------------------------------------------------------------------------- DeepSeek-V4.1
# Roles from `config.v41` (config/v41.py): full (kv source: compressor, index keys, own indexer), reindex,
# reuse, window. Its native formats ("auto"): window rows fp8_e8m0_b32, compressed rows fp4_e4m3_b16,
# index keys fp4_e8m0_b32 (no Hadamard); "bf16" keeps every row unrounded. Packed pools (the default
# of a quantized cache) hold each format's bytes; the attention then reads window and compressed
# rows of two formats (torch reference only for now: `ops/sparse_attn.py`).
_V41_NATIVE = ("fp8_e8m0_b32", "fp4_e4m3_b16", "fp4_e8m0_b32")
_V41_MODES = {"window": IndexerMode.NONE, "full": IndexerMode.FULL, "reindex": IndexerMode.REINDEX,
              "reuse": IndexerMode.REUSE}


def _v41_plans(config: ModelConfig, cache: CacheFormat, packed: bool | None) -> ModelPlan:
    v = config.v41
    names = _V41_NATIVE if cache.quantized else ("bf16",) * 3
    window = _checked(names[0], config.head_dim, "head_dim")
    compressed = _checked(names[1], config.head_dim, "head_dim")
    index = _checked(names[2], config.index_head_dim, "index_head_dim")
    plans = []
    for layer, ratio in enumerate(config.compress_ratios):
        role = v.role(layer)
        kind = CompressorKind.NONE
        if role == "full":
            kind = CompressorKind.PLAIN if ratio > 1 else CompressorKind.GATELESS
        plans.append(LayerPlan(
            layer=layer, ratio=ratio, compressor=kind, indexer=_V41_MODES[role],
            kv_source=v.kv_source(layer) if ratio else layer, head_dim=config.head_dim,
            index_head_dim=config.index_head_dim, window_format=window,
            compressed_format=compressed if ratio else None, index_format=index if ratio else None,
            packed=cache.quantized if packed is None else packed and cache.quantized, q_head_rms=False,
            publishes_candidates=layer == v.candidate_source_layer_id,
            candidate_restricted=v.candidate_restricted(layer), lagged_hc=True,
            engram_table=v.engram_layer_ids.index(layer) if layer in v.engram_layer_ids else None,
        ))
    history = v.engram_max_ngram_size - 1 if v.engram_layer_ids else 0
    return ModelPlan(cache, tuple(plans), hc_head=False, fp32_head=True, token_history=history,
                     token_pad=v.engram_pad_token_id)
