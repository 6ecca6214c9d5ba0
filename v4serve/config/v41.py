"""DeepSeek-V4.1: its settings beyond V4's geometry (V41Config: layer roles, candidates, Engram) and
its spellings (HF `text_config`, the flat reference `inference_config.json` names), which it turns
into V4 field names before ModelConfig reads them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from v4serve.config.fields import ConfigError, number_field, positive_field
from v4serve.config.geometry import CSA2, SLIDING
from v4serve.config.short_names import INFERENCE_SHORT_NAMES

# A V4.1 config is recognised by `model_type` `deepseek_v41` / `deepseek_v41_text`, by a
# `text_config`, or by the flat reference names (`kv_source_layers`); its geometry lives under
# `text_config` (HF) or flat in `inference_config.json` / `inference/config.json` (the reference
# `ModelArgs` names).
#
# Layer roles (ratio r > 0 means the layer READS compressed rows):
#   full    L in kv_source_layer_ids: owns the compressor, writes the compressed KV and index keys,
#           runs its own indexer and publishes its top-k;
#   reindex L in index_source_layer_ids but not a kv source: own indexer queries / weights over the
#           index keys of its kv source; restricted to the candidate mask when after the candidate source;
#   reuse   every other r > 0 layer: the top-k last published, the kv source's compressed KV;
#   window  r == 0.
# kv source of L = the last kv source <= L (same ratio); index source = the last index source <= L.

_V41_SHORT_NAMES = {
    **INFERENCE_SHORT_NAMES,
    "kv_source_layers": "kv_source_layer_ids",
    "index_source_layers": "index_source_layer_ids",
    "candidate_source_layer": "candidate_source_layer_id",
    "engram_pad_id": "engram_pad_token_id",
    "n_mtp_layers": "num_nextn_predict_layers",
}
_V41_SAME_NAMES = (
    "candidate_topk_blocks", "candidate_block_size", "engram_layer_ids", "engram_num_embeddings",
    "engram_max_ngram_size", "engram_vocab_size", "engram_n_heads", "engram_head_dim",
    "engram_compressed_vocab_size", "image_token_id", "norm_topk_prob", "max_position_embeddings",
)
V41_ROLES = ("window", "full", "reindex", "reuse")


@dataclass(frozen=True)
class V41Config:
    """The DeepSeek-V4.1 settings beyond V4's geometry."""

    compress_ratios: tuple[int, ...]
    kv_source_layer_ids: tuple[int, ...]
    index_source_layer_ids: tuple[int, ...]
    candidate_source_layer_id: int | None
    candidate_topk_blocks: int
    candidate_block_size: int
    engram_layer_ids: tuple[int, ...] = ()
    engram_num_embeddings: tuple[int, ...] = ()
    engram_max_ngram_size: int = 4
    engram_vocab_size: int = 0
    engram_n_heads: int = 0
    engram_head_dim: int = 0
    engram_pad_token_id: int = 2
    engram_compressed_vocab_size: int = 0
    image_token_id: int | None = None
    num_nextn_predict_layers: int = 0

    def layer_types(self, n_layers: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
        ratios = self.compress_ratios[:n_layers]
        return tuple(CSA2 if r else SLIDING for r in ratios), ratios

    def role(self, layer: int) -> str:
        if not self.compress_ratios[layer]:
            return "window"
        if layer in self.kv_source_layer_ids:
            return "full"
        return "reindex" if layer in self.index_source_layer_ids else "reuse"

    def kv_source(self, layer: int) -> int | None:
        """The layer whose compressed KV and index keys `layer` reads (None: window only)."""
        if not self.compress_ratios[layer]:
            return None
        return max(s for s in self.kv_source_layer_ids if s <= layer)

    def index_source(self, layer: int) -> int | None:
        """The layer whose top-k `layer` attends with (itself for full / reindex layers)."""
        if not self.compress_ratios[layer]:
            return None
        return max(s for s in self.index_source_layer_ids if s <= layer)

    def candidate_restricted(self, layer: int) -> bool:
        """A reindex layer after the candidate source scores only the published candidates."""
        c = self.candidate_source_layer_id
        return self.role(layer) == "reindex" and c is not None and layer > c

    def validate(self, n_layers: int) -> None:
        ratios = self.compress_ratios
        if len(ratios) < n_layers:
            raise ConfigError(f"config field `compress_ratios` must have at least {n_layers} entries, got {len(ratios)}")
        for i, r in enumerate(ratios[:n_layers]):
            if r not in (0, 1, 2):
                raise ConfigError(f"config field `compress_ratios[{i}]` = {r}; DeepSeek-V4.1 layers use 0, 1 or 2")
        for name in ("kv_source_layer_ids", "index_source_layer_ids"):
            for s in getattr(self, name):
                if not 0 <= s < n_layers or not ratios[s]:
                    raise ConfigError(f"config field `{name}` lists layer {s}, which is not a compressed layer")
        if not set(self.kv_source_layer_ids) <= set(self.index_source_layer_ids):
            raise ConfigError("config field `index_source_layer_ids` must include every `kv_source_layer_ids` entry")
        for layer in range(n_layers):
            if not ratios[layer]:
                continue
            sources = [s for s in self.kv_source_layer_ids if s <= layer]
            if not sources:
                raise ConfigError(f"layer {layer} (compress ratio {ratios[layer]}) has no kv source layer at or before it")
            if ratios[sources[-1]] != ratios[layer]:
                raise ConfigError(
                    f"layer {layer} has compress ratio {ratios[layer]} but its kv source layer {sources[-1]} has "
                    f"{ratios[sources[-1]]}"
                )
            index = max(s for s in self.index_source_layer_ids if s <= layer)
            if self.kv_source(index) != sources[-1]:
                raise ConfigError(f"layer {layer} would reuse the top-k of layer {index}, which reads another kv source")
        c = self.candidate_source_layer_id
        if c is not None and c not in self.kv_source_layer_ids:
            raise ConfigError(f"config field `candidate_source_layer_id` ({c}) must be a kv source layer")
        if c is not None:
            positive_field(self.candidate_topk_blocks, "candidate_topk_blocks", int)
            positive_field(self.candidate_block_size, "candidate_block_size", int)
        if len(self.engram_num_embeddings) not in (0, len(self.engram_layer_ids)):
            raise ConfigError("config field `engram_num_embeddings` needs one entry per `engram_layer_ids` entry")
        for s in self.engram_layer_ids:
            if not 0 <= s < n_layers:
                raise ConfigError(f"config field `engram_layer_ids` lists layer {s}, outside the {n_layers} layers")
        if self.engram_layer_ids:
            for name in ("engram_max_ngram_size", "engram_n_heads", "engram_head_dim",
                         "engram_compressed_vocab_size"):
                positive_field(getattr(self, name), name, int)


def is_v41(raw: dict[str, Any]) -> bool:
    return ("text_config" in raw or raw.get("model_type") in ("deepseek_v41", "deepseek_v41_text")
            or "kv_source_layers" in raw or "kv_source_layer_ids" in raw)


def v41_merge_flat(raw: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    """config.json over the reference's flat config (its short names translated): the HF file wins."""
    merged = _v41_flatten(raw)
    for short, value in flat.items():
        name = _V41_SHORT_NAMES.get(short, short if short in _V41_SAME_NAMES else None)
        if name is not None and name not in merged:
            merged[name] = value
    return merged


def _v41_flatten(raw: dict[str, Any]) -> dict[str, Any]:
    """`text_config` keys over the top-level ones (quantization_config etc. stay), short names mapped."""
    text = raw.get("text_config") or {}
    if not isinstance(text, dict):
        raise ConfigError(f"config field `text_config` must be an object, got {text!r}")
    merged = {k: v for k, v in raw.items() if k != "text_config"}
    merged.update(text)
    for short, name in _V41_SHORT_NAMES.items():
        if short in merged and name not in merged:
            merged[name] = merged.pop(short)
    return merged


def v41_prepare(raw: dict[str, Any]) -> tuple[dict[str, Any], V41Config]:
    """The flattened raw config (V4 names) and the V4.1 settings, validated."""
    raw = _v41_flatten(raw)
    raw["model_type"] = "deepseek_v41"
    if raw.get("num_hash_layers"):
        raise ConfigError("config field `num_hash_layers`: DeepSeek-V4.1 has no hash-routed layers")
    raw["num_hash_layers"] = 0
    if raw.get("compress_ratios") is None:
        raise ConfigError("config.json is missing the required field `compress_ratios` (DeepSeek-V4.1)")
    if raw.get("kv_source_layer_ids") is None:
        raise ConfigError("config.json is missing the required field `kv_source_layer_ids` (DeepSeek-V4.1)")

    def ints(name: str, default: Any = ()) -> tuple[int, ...]:
        value = raw.get(name, default)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config field `{name}` must be a list of integers, got {value!r}")
        return tuple(number_field(v, f"{name}[{i}]", int) for i, v in enumerate(value))

    def opt_int(name: str, default: Any) -> Any:
        value = raw.get(name, default)
        return None if value is None else number_field(value, name, int)

    kv_sources = ints("kv_source_layer_ids")
    v41 = V41Config(
        compress_ratios=ints("compress_ratios"),
        kv_source_layer_ids=kv_sources,
        index_source_layer_ids=ints("index_source_layer_ids", list(kv_sources)),
        candidate_source_layer_id=opt_int("candidate_source_layer_id", None),
        candidate_topk_blocks=opt_int("candidate_topk_blocks", 2048),
        candidate_block_size=opt_int("candidate_block_size", 8),
        engram_layer_ids=ints("engram_layer_ids"),
        engram_num_embeddings=ints("engram_num_embeddings"),
        engram_max_ngram_size=opt_int("engram_max_ngram_size", 4),
        engram_vocab_size=opt_int("engram_vocab_size", 0),
        engram_n_heads=opt_int("engram_n_heads", 0),
        engram_head_dim=opt_int("engram_head_dim", 0),
        engram_pad_token_id=opt_int("engram_pad_token_id", 2),
        engram_compressed_vocab_size=opt_int("engram_compressed_vocab_size", 0),
        image_token_id=opt_int("image_token_id", None),
        num_nextn_predict_layers=opt_int("num_nextn_predict_layers", 0),
    )
    n_layers = positive_field(raw.get("num_hidden_layers"), "num_hidden_layers", int)
    v41.validate(n_layers)
    for name in list(raw):
        if name in {f.name for f in dataclasses.fields(V41Config)}:
            raw.pop(name)
    return raw, v41
