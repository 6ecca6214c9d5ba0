"""Model configuration: one frozen, validated dataclass built from a checkpoint's `config.json`.

Three spellings of the same DeepSeek-V4 geometry are accepted:

* transformers' (`layer_types`, `compress_rates`, `mlp_layer_types`, nested `rope_parameters`,
  `partial_rotary_factor`), as `DeepseekV4Config.save_pretrained` writes it;
* the official checkpoint's (`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`,
  `rope_scaling`);
* the reference `inference/config.json` short names (`dim`, `n_layers`, `n_heads`, ...), used
  when that file sits next to `config.json`.

Everything is resolved here, once: the rest of the engine reads plain per-layer tuples
(`compress_ratios`, `layer_types`, `mlp_layer_types`) and never looks at raw JSON.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"  # ratio-4 compressor with overlap + lightning indexer
HCA = "heavily_compressed_attention"  # ratio-128 compressor, every compressed row visible
# V4.1 (block "DeepSeek-V4.1" at the end of the file): a layer that reads compressed rows (ratio 1 or 2).
CSA2 = "compressed_sparse_attention_v41"
LAYER_TYPES = (SLIDING, CSA, HCA, CSA2)
MLP_LAYER_TYPES = ("hash_moe", "moe")
_RATIO_TO_LAYER_TYPE = {0: SLIDING, 4: CSA, 128: HCA}

# Short names of the reference `inference/config.json` -> our field names.
_INFERENCE_SHORT_NAMES = {
    "vocab_size": "vocab_size",
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "head_dim": "head_dim",
    "rope_head_dim": "qk_rope_head_dim",
    "q_lora_rank": "q_lora_rank",
    "o_lora_rank": "o_lora_rank",
    "o_groups": "o_groups",
    "window_size": "sliding_window",
    "moe_inter_dim": "moe_intermediate_size",
    "n_routed_experts": "n_routed_experts",
    "n_shared_experts": "n_shared_experts",
    "n_activated_experts": "num_experts_per_tok",
    "score_func": "scoring_func",
    "route_scale": "routed_scaling_factor",
    "n_hash_layers": "num_hash_layers",
    "swiglu_limit": "swiglu_limit",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
    "compress_rope_theta": "compress_rope_theta",
    "compress_ratios": "compress_ratios",
    "index_n_heads": "index_n_heads",
    "index_head_dim": "index_head_dim",
    "index_topk": "index_topk",
    "hc_mult": "hc_mult",
    "hc_sinkhorn_iters": "hc_sinkhorn_iters",
    "hc_eps": "hc_eps",
    "rope_factor": "rope_factor",
    "original_seq_len": "original_max_position_embeddings",
    "beta_fast": "beta_fast",
    "beta_slow": "beta_slow",
}


class ConfigError(ValueError):
    """A config.json field is missing, has the wrong type or contradicts another field."""


@dataclass(frozen=True)
class YarnScaling:
    """YaRN frequency interpolation of the compressed layers' RoPE (no attention mscale in V4)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0


# ---------------------------------------------------------------------- quantization
_QUANT_FIELDS = ("quantization_config", "expert_dtype")
EXPERT_DTYPES = ("fp4", "fp8", "bf16")
# `quantization=` values (vLLM's argument name): None = what config.json says.
QUANTIZATION_CHOICES = ("fp8", "fp8-reference", "none")


@dataclass(frozen=True)
class QuantConfig:
    """How the checkpoint stores its weights (`quantization_config` + `expert_dtype` of config.json).

    Dense linears: e4m3 codes `[N, K]` with one scale per `weight_block_size` = (bn, bk) block,
    scale shape `[ceil(N/bn), ceil(K/bk)]`; `scale_fmt` "ue8m0" (power-of-two scales stored as
    F8_E8M0) or None (fp32 scales). Routed experts: `expert_dtype` "fp4" = OCP MXFP4 (packed e2m1
    pairs + ue8m0 per 32 along K), "bf16" = unquantized, "fp8" = block FP8 like the dense ones.
    `act_block`: None = weight-only numerics (activations stay in the model dtype); an int = the
    official numerics, activations quantized to e4m3 per `act_block` channels before each FP8 GEMM
    (only ever set explicitly: `quantization="fp8-reference"`)."""

    method: str = "fp8"
    fmt: str = "e4m3"
    scale_fmt: str | None = "ue8m0"
    weight_block_size: tuple[int, int] = (128, 128)
    expert_dtype: str = "fp4"
    act_block: int | None = None

    def __post_init__(self) -> None:
        if self.method != "fp8":
            raise ConfigError(f"config field `quantization_config.quant_method` = {self.method!r}; only 'fp8' is supported")
        if self.fmt != "e4m3":
            raise ConfigError(f"config field `quantization_config.fmt` = {self.fmt!r}; only 'e4m3' is supported")
        if self.scale_fmt not in ("ue8m0", None):
            raise ConfigError(f"config field `quantization_config.scale_fmt` = {self.scale_fmt!r}; "
                              "expected 'ue8m0' or absent (fp32 scales)")
        if len(self.weight_block_size) != 2:
            raise ConfigError(f"config field `quantization_config.weight_block_size` must be [bn, bk], "
                              f"got {list(self.weight_block_size)!r}")
        for i, b in enumerate(self.weight_block_size):
            _positive(b, f"quantization_config.weight_block_size[{i}]", int)
        if self.expert_dtype not in EXPERT_DTYPES:
            raise ConfigError(f"config field `expert_dtype` = {self.expert_dtype!r} is not one of {EXPERT_DTYPES}")
        if self.act_block is not None:
            _positive(self.act_block, "act_block", int)

    @classmethod
    def from_raw(cls, raw: dict[str, Any], flat_block: tuple[int, int] = (128, 128)) -> "QuantConfig | None":
        """From config.json: `quantization_config` (official or transformers' spelling; transformers
        moves `expert_dtype` inside it), top-level `expert_dtype`; or the official flat
        inference/config.json's `dtype: fp8`, whose blocks the model defines (`flat_block`: 128 x 128
        for V4, 32 x 32 for V4.1). None when the weights are plain."""
        q = raw.get("quantization_config")
        expert = raw.get("expert_dtype")
        if q is None and raw.get("dtype") == "fp8":  # the official flat inference/config.json
            q = {"scale_fmt": raw.get("scale_fmt", "ue8m0"), "weight_block_size": raw.get("weight_block_size", list(flat_block))}
        if q is None:
            if expert not in (None, "bf16"):
                raise ConfigError(f"config field `expert_dtype` = {expert!r} needs a `quantization_config`")
            return None
        if not isinstance(q, dict):
            raise ConfigError(f"config field `quantization_config` must be an object, got {q!r}")
        block = q.get("weight_block_size", [128, 128])
        if not isinstance(block, (list, tuple)):
            raise ConfigError(f"config field `quantization_config.weight_block_size` must be [bn, bk], got {block!r}")
        return cls(
            method=q.get("quant_method", "fp8"), fmt=q.get("fmt", "e4m3"), scale_fmt=q.get("scale_fmt"),
            weight_block_size=tuple(block), expert_dtype=q.get("expert_dtype", expert) or "bf16",
        )

    @classmethod
    def official(cls) -> "QuantConfig":
        """DeepSeek-V4 / V4-Pro as released: FP8 e4m3 dense with ue8m0 128x128 blocks, MXFP4 experts."""
        return cls()

    def to_hf_dict(self) -> dict[str, Any]:
        q = {"quant_method": self.method, "fmt": self.fmt, "weight_block_size": list(self.weight_block_size)}
        if self.scale_fmt is not None:
            q["scale_fmt"] = self.scale_fmt
        return {"quantization_config": q, "expert_dtype": self.expert_dtype}


def apply_quantization_override(config: "ModelConfig", quantization: str | None) -> "ModelConfig":
    """`LLM(quantization=...)` over config.json: None keeps it; "fp8" = config.json's scheme (the
    official one where config.json has none); "fp8-reference" = that with the official activation
    quantization (e4m3 per block of K before every FP8 GEMM); "none" = plain weights (presets)."""
    if quantization is None:
        return config
    if quantization not in QUANTIZATION_CHOICES:
        raise ConfigError(f"quantization {quantization!r} is not one of {QUANTIZATION_CHOICES} (or None: config.json)")
    if quantization == "none":
        return config.replace(quantization=None)
    q = config.quantization or QuantConfig.official()
    act = q.weight_block_size[1] if quantization == "fp8-reference" else None
    return config.replace(quantization=dataclasses.replace(q, act_block=act))


@dataclass(frozen=True)
class ModelConfig:
    """Geometry of a DeepSeek-V4 model. Construct with `from_pretrained`, `from_dict` or a preset."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    sliding_window: int
    layer_types: tuple[str, ...]
    compress_ratios: tuple[int, ...]
    mlp_layer_types: tuple[str, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    routed_scaling_factor: float
    scoring_func: str = "sqrtsoftplus"
    norm_topk_prob: bool = True
    swiglu_limit: float = 10.0
    hc_mult: int = 4
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    compress_rope_theta: float = 160000.0
    compress_yarn: YarnScaling | None = None
    max_position_embeddings: int = 1048576
    bos_token_id: int = 0
    eos_token_ids: tuple[int, ...] = (1,)
    tie_word_embeddings: bool = False
    model_type: str = "deepseek_v4"
    v41: "V41Config | None" = None  # DeepSeek-V4.1 only (layer roles, candidates, Engram)
    quantization: QuantConfig | None = None  # None: every weight in the model dtype
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._validate()

    # ------------------------------------------------------------------ derived geometry
    @property
    def page_size(self) -> int:
        """Tokens per KV page; equal to the attention window (DESIGN.md: page = window)."""
        return self.sliding_window

    @property
    def indexed_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == CSA)

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        positive = (
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "head_dim",
            "qk_rope_head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "sliding_window",
            "index_n_heads", "index_head_dim", "index_topk", "n_routed_experts",
            "num_experts_per_tok", "moe_intermediate_size", "hc_mult", "hc_sinkhorn_iters",
            "max_position_embeddings",
        )
        for name in positive:
            _positive(getattr(self, name), name, int)
        # `swiglu_limit` too: the experts always clamp, there is no "no limit" spelling (a missing
        # field is transformers' default, 10).
        for name in ("routed_scaling_factor", "swiglu_limit", "hc_eps", "rms_norm_eps", "rope_theta",
                     "compress_rope_theta"):
            _positive(getattr(self, name), name)
        token_ids = (("bos_token_id", self.bos_token_id), *(("eos_token_id", t) for t in self.eos_token_ids))
        for name, value in (("n_shared_experts", self.n_shared_experts), *token_ids):
            if _number(value, name, int) < 0:
                raise ConfigError(f"config field `{name}` must be a non-negative integer, got {value!r}")
        n = self.num_hidden_layers
        for name in ("layer_types", "compress_ratios", "mlp_layer_types"):
            if len(getattr(self, name)) != n:
                raise ConfigError(
                    f"config field `{name}` has {len(getattr(self, name))} entries but "
                    f"`num_hidden_layers` is {n}"
                )
        for i, (kind, ratio) in enumerate(zip(self.layer_types, self.compress_ratios)):
            if kind not in LAYER_TYPES:
                raise ConfigError(f"config field `layer_types[{i}]` = {kind!r} is not one of {LAYER_TYPES}")
            if (kind == SLIDING) != (ratio == 0):
                raise ConfigError(f"layer {i}: type {kind!r} is inconsistent with compress ratio {ratio}")
            if ratio < 0 or (ratio > 0 and self.page_size % ratio):
                raise ConfigError(
                    f"layer {i}: compress ratio {ratio} must divide `sliding_window` "
                    f"({self.sliding_window}), the KV page size"
                )
        for i, kind in enumerate(self.mlp_layer_types):
            if kind not in MLP_LAYER_TYPES:
                raise ConfigError(f"config field `mlp_layer_types[{i}]` = {kind!r} is not one of {MLP_LAYER_TYPES}")
        if self.qk_rope_head_dim > self.head_dim or self.qk_rope_head_dim % 2:
            raise ConfigError(
                f"config field `qk_rope_head_dim` ({self.qk_rope_head_dim}) must be even and <= "
                f"`head_dim` ({self.head_dim})"
            )
        if self.qk_rope_head_dim > self.index_head_dim and self.indexed_layers:
            raise ConfigError("config field `index_head_dim` must be >= `qk_rope_head_dim`")
        if self.num_attention_heads % self.o_groups:
            raise ConfigError(
                f"config field `o_groups` ({self.o_groups}) must divide `num_attention_heads` "
                f"({self.num_attention_heads})"
            )
        if self.num_experts_per_tok > self.n_routed_experts:
            raise ConfigError("config field `num_experts_per_tok` exceeds `n_routed_experts`")
        if self.scoring_func not in ("sqrtsoftplus", "softmax", "sigmoid"):
            raise ConfigError(f"config field `scoring_func` = {self.scoring_func!r} is not supported")
        if not self.eos_token_ids:
            raise ConfigError("config field `eos_token_id` is empty")

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(cls, path: str | Path) -> "ModelConfig":
        """Read `config.json` (and `inference/config.json` when present) from a checkpoint folder."""
        path = Path(path)
        config_file = path / "config.json" if path.is_dir() else path
        if not config_file.is_file():
            raise FileNotFoundError(f"no config.json in {path}")
        try:
            raw = json.loads(config_file.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{config_file} is not valid JSON: {e}") from e
        inference = config_file.parent / "inference" / "config.json"
        if not inference.is_file():  # V4.1 checkpoints ship it flat beside config.json
            inference = config_file.parent / "inference_config.json"
        if inference.is_file() and _is_v41(raw):
            raw = _v41_merge_flat(raw, json.loads(inference.read_text()))
        elif inference.is_file():
            short = json.loads(inference.read_text())
            raw = {**{_INFERENCE_SHORT_NAMES[k]: v for k, v in short.items() if k in _INFERENCE_SHORT_NAMES}, **raw}
        return cls.from_dict(raw)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        """Resolve the transformers / official / short spellings into one validated config."""
        raw = dict(raw)
        v41 = None
        if _is_v41(raw):  # DeepSeek-V4.1: see the block at the end of the file
            raw, v41 = _v41_prepare(raw)
        model_type = raw.get("model_type", "deepseek_v4")
        if model_type != "deepseek_v4" and v41 is None:
            raise ConfigError(
                f"config field `model_type` = {model_type!r}; only 'deepseek_v4' and 'deepseek_v41' are supported"
            )

        def need(name: str) -> Any:
            if name not in raw or raw[name] is None:
                raise ConfigError(f"config.json is missing the required field `{name}`")
            return raw[name]

        def number(name: str, default: float) -> float:
            return _number(raw.get(name, default), name)

        n_layers = _positive(need("num_hidden_layers"), "num_hidden_layers", int)
        layer_types, ratios = _resolve_layer_types(raw, n_layers) if v41 is None else v41.layer_types(n_layers)
        head_dim = need("head_dim")
        rope_theta, compress_theta, yarn = _resolve_rope(raw)
        eos = raw.get("eos_token_id", 1)
        eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(
            vocab_size=need("vocab_size"),
            hidden_size=need("hidden_size"),
            num_hidden_layers=n_layers,
            num_attention_heads=need("num_attention_heads"),
            head_dim=head_dim,
            qk_rope_head_dim=_resolve_rope_head_dim(raw, head_dim),
            q_lora_rank=need("q_lora_rank"),
            o_lora_rank=need("o_lora_rank"),
            o_groups=need("o_groups"),
            sliding_window=raw.get("sliding_window", 128),
            layer_types=layer_types,
            compress_ratios=ratios,
            mlp_layer_types=_resolve_mlp_layer_types(raw, n_layers),
            index_n_heads=raw.get("index_n_heads", 64),
            index_head_dim=raw.get("index_head_dim", 128),
            index_topk=raw.get("index_topk", 512),
            n_routed_experts=need("n_routed_experts"),
            n_shared_experts=raw.get("n_shared_experts", 1),
            num_experts_per_tok=need("num_experts_per_tok"),
            moe_intermediate_size=need("moe_intermediate_size"),
            routed_scaling_factor=number("routed_scaling_factor", 1.0),
            scoring_func=raw.get("scoring_func", "sqrtsoftplus"),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            swiglu_limit=number("swiglu_limit", 10.0),
            hc_mult=raw.get("hc_mult", 4),
            hc_sinkhorn_iters=raw.get("hc_sinkhorn_iters", 20),
            hc_eps=number("hc_eps", 1e-6),
            rms_norm_eps=number("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            compress_rope_theta=compress_theta,
            compress_yarn=yarn,
            max_position_embeddings=raw.get("max_position_embeddings", 1048576),
            bos_token_id=raw.get("bos_token_id", 0) if raw.get("bos_token_id") is not None else 0,
            eos_token_ids=eos_ids,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            model_type="deepseek_v4" if v41 is None else "deepseek_v41",
            v41=v41,
            quantization=QuantConfig.from_raw(raw, (32, 32) if v41 is not None else (128, 128)),
            extra={k: v for k, v in raw.items() if k not in known and k not in _QUANT_FIELDS},
        )

    def replace(self, **changes: Any) -> "ModelConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def to_hf_dict(self) -> dict[str, Any]:
        """The config in transformers' spelling (what `save_pretrained` would write)."""
        rates = {t: r for t, r in zip(self.layer_types, self.compress_ratios) if r > 0}
        compress = {"rope_type": "default", "rope_theta": self.compress_rope_theta,
                    "partial_rotary_factor": self.qk_rope_head_dim / self.head_dim}
        if self.compress_yarn is not None:
            y = self.compress_yarn
            compress.update(rope_type="yarn", factor=y.factor, beta_fast=y.beta_fast, beta_slow=y.beta_slow,
                            original_max_position_embeddings=y.original_max_position_embeddings,
                            attention_factor=1.0)
        return {
            "model_type": "deepseek_v4",
            "architectures": ["DeepseekV4ForCausalLM"],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": 1,
            "head_dim": self.head_dim,
            "partial_rotary_factor": self.qk_rope_head_dim / self.head_dim,
            "q_lora_rank": self.q_lora_rank,
            "o_lora_rank": self.o_lora_rank,
            "o_groups": self.o_groups,
            "sliding_window": self.sliding_window,
            "layer_types": list(self.layer_types),
            "compress_rates": {CSA: rates.get(CSA, 4), HCA: rates.get(HCA, 128)},
            "mlp_layer_types": list(self.mlp_layer_types),
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "n_routed_experts": self.n_routed_experts,
            "n_shared_experts": self.n_shared_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "routed_scaling_factor": self.routed_scaling_factor,
            "scoring_func": self.scoring_func,
            "norm_topk_prob": self.norm_topk_prob,
            "swiglu_limit": self.swiglu_limit,
            "hc_mult": self.hc_mult,
            "hc_sinkhorn_iters": self.hc_sinkhorn_iters,
            "hc_eps": self.hc_eps,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "compress_rope_theta": self.compress_rope_theta,
            "rope_parameters": {
                "main": {"rope_type": "default", "rope_theta": self.rope_theta,
                         "partial_rotary_factor": self.qk_rope_head_dim / self.head_dim},
                "compress": compress,
            },
            "max_position_embeddings": self.max_position_embeddings,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else list(self.eos_token_ids),
            "tie_word_embeddings": self.tie_word_embeddings,
            **(self.quantization.to_hf_dict() if self.quantization is not None else {}),
        }


def _resolve_layer_types(raw: dict[str, Any], n: int) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Per-layer attention type and compress ratio from `layer_types`+`compress_rates` or legacy
    `compress_ratios` (one trailing entry per MTP layer is dropped). When a config carries both
    spellings (an official `inference/config.json` beside a converted `config.json`, say) they must
    agree: we cannot tell which one the weights were trained with."""
    legacy = _legacy_compress_ratios(raw, n) if raw.get("compress_ratios") is not None else None
    if raw.get("layer_types") is not None:
        types = raw["layer_types"]
        if not isinstance(types, list) or len(types) < n:
            raise ConfigError(f"config field `layer_types` must list {n} layer types, got {types!r}")
        types = tuple(types[:n])
        for t in types:
            if t not in LAYER_TYPES:
                raise ConfigError(f"config field `layer_types` has unknown entry {t!r}; expected one of {LAYER_TYPES}")
    elif legacy is not None:
        types = tuple(_RATIO_TO_LAYER_TYPE[r] for r in legacy)
    else:
        raise ConfigError("config.json is missing the required field `layer_types` (or legacy `compress_ratios`)")
    rates = _compress_rates(raw)
    ratios = tuple(0 if t == SLIDING else rates[t] for t in types)
    if legacy is not None and ratios != legacy:
        i = next(i for i, (new, old) in enumerate(zip(ratios, legacy)) if new != old)
        raise ConfigError(
            f"config fields `layer_types`/`compress_rates` give layer {i} compress ratio {ratios[i]} but the "
            f"legacy `compress_ratios` gives {legacy[i]}; keep one spelling or make them agree"
        )
    return types, ratios


def _legacy_compress_ratios(raw: dict[str, Any], n: int) -> tuple[int, ...]:
    ratios = raw["compress_ratios"]
    if not isinstance(ratios, list) or len(ratios) < n:
        raise ConfigError(f"config field `compress_ratios` must have at least {n} entries, got {ratios!r}")
    ratios = tuple(_number(r, f"compress_ratios[{i}]", int) for i, r in enumerate(ratios[:n]))
    bad = [r for r in ratios if r not in _RATIO_TO_LAYER_TYPE]
    if bad:
        raise ConfigError(f"config field `compress_ratios` has ratios {bad}; legacy configs allow 0, 4 and 128")
    return ratios


def _compress_rates(raw: dict[str, Any]) -> dict[str, int]:
    """Compress ratio per compressing layer type: `compress_rates` over transformers' defaults."""
    rates = raw.get("compress_rates") or {}
    if not isinstance(rates, dict):
        raise ConfigError(f"config field `compress_rates` must map layer types to ratios, got {rates!r}")
    return {CSA: 4, HCA: 128, **{t: _number(r, f"compress_rates.{t}", int) for t, r in rates.items()}}


def _resolve_mlp_layer_types(raw: dict[str, Any], n: int) -> tuple[str, ...]:
    """`mlp_layer_types`, else legacy `num_hash_layers` hash-routed layers (default 3) then score-routed ones."""
    if raw.get("mlp_layer_types") is not None:
        types = raw["mlp_layer_types"]
        if not isinstance(types, list) or len(types) < n:
            raise ConfigError(f"config field `mlp_layer_types` must list {n} entries, got {types!r}")
        return tuple(types[:n])
    n_hash = _number(raw.get("num_hash_layers", 3), "num_hash_layers", int)
    if n_hash < 0:
        raise ConfigError(f"config field `num_hash_layers` must be a non-negative integer, got {n_hash}")
    # More hash layers than layers (a model cut with `num_hidden_layers`) routes every layer by hash.
    return tuple("hash_moe" if i < n_hash else "moe" for i in range(n))


def _resolve_rope_head_dim(raw: dict[str, Any], head_dim: Any) -> Any:
    """RoPE channels per head: official `qk_rope_head_dim`, else transformers'
    `head_dim * partial_rotary_factor` (truncated, as transformers does), else DeepSeek-V4's 64."""
    if raw.get("qk_rope_head_dim") is not None:
        return raw["qk_rope_head_dim"]  # checked with the other integer fields
    factor = raw.get("partial_rotary_factor")
    if factor is None:
        return 64
    factor = _number(factor, "partial_rotary_factor")
    if not 0 < factor <= 1:
        raise ConfigError(f"config field `partial_rotary_factor` must be in (0, 1], got {factor!r}")
    return int(_number(head_dim, "head_dim", int) * factor)


def _resolve_rope(raw: dict[str, Any]) -> tuple[float, float, YarnScaling | None]:
    """(plain theta, compressed-layer theta, YaRN of the compressed layers) from nested
    `rope_parameters` (transformers) or flat `rope_theta`/`compress_rope_theta`/`rope_scaling`."""
    params = raw.get("rope_parameters") or {}
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        main, compress = params["main"], params["compress"]
        rope_theta = _number(main.get("rope_theta", raw.get("rope_theta", 10000.0)), "rope_theta")
        compress_theta = _number(compress.get("rope_theta", raw.get("compress_rope_theta", 160000.0)),
                                 "compress_rope_theta")
        scaling = compress if compress.get("rope_type", compress.get("type")) == "yarn" else None
    else:
        rope_theta = _number(raw.get("rope_theta", 10000.0), "rope_theta")
        compress_theta = _number(raw.get("compress_rope_theta", 160000.0), "compress_rope_theta")
        scaling = raw.get("rope_scaling") or (params if params.get("rope_type") == "yarn" else None)
        if scaling is None and raw.get("rope_factor"):
            scaling = {"type": "yarn", "factor": raw["rope_factor"],
                       "original_max_position_embeddings": raw.get("original_max_position_embeddings"),
                       "beta_fast": raw.get("beta_fast", 32), "beta_slow": raw.get("beta_slow", 1)}
    if not scaling:
        return rope_theta, compress_theta, None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "yarn":
        raise ConfigError(f"config field `rope_scaling.type` = {kind!r}; only 'yarn' is supported")
    original = scaling.get("original_max_position_embeddings")
    if original is None:
        raise ConfigError("config field `rope_scaling.original_max_position_embeddings` is required for YaRN")
    original = _positive(original, "rope_scaling.original_max_position_embeddings", int)
    factor = scaling.get("factor")
    if factor is None:
        factor = _positive(raw.get("max_position_embeddings", 1048576), "max_position_embeddings", int) / original
    yarn = YarnScaling(
        factor=_positive(factor, "rope_scaling.factor"),
        original_max_position_embeddings=original,
        beta_fast=_positive(scaling.get("beta_fast", 32), "rope_scaling.beta_fast"),
        beta_slow=_positive(scaling.get("beta_slow", 1), "rope_scaling.beta_slow"),
    )
    return rope_theta, compress_theta, yarn


def _number(value: Any, name: str, kind: type[int] | type[float] = float) -> Any:
    """`value` as a `kind` (int or float), or a ConfigError naming the field. Only JSON numbers pass
    (an int field takes only ints): a string or bool that happens to convert is a typo, not a
    setting, and `float("abc")` would fail with no field name."""
    accepted = int if kind is int else (int, float)
    if (isinstance(value, bool) or not isinstance(value, accepted)
            or (isinstance(value, float) and not math.isfinite(value))):
        raise ConfigError(f"config field `{name}` must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    return kind(value)


def _positive(value: Any, name: str, kind: type[int] | type[float] = float) -> Any:
    """`value` as a `kind` that is > 0, or a ConfigError naming the field."""
    number = _number(value, name, kind)
    if number <= 0:
        raise ConfigError(f"config field `{name}` must be a positive {'integer' if kind is int else 'number'}, "
                          f"got {value!r}")
    return number


# ====================================================================================== DeepSeek-V4.1
# Kept in one block (other branches edit the V4 part of this file). A V4.1 config is recognised by
# `model_type` `deepseek_v41` / `deepseek_v41_text`, by a `text_config`, or by the flat reference
# names (`kv_source_layers`); its geometry lives under `text_config` (HF) or flat in
# `inference_config.json` / `inference/config.json` (the reference `ModelArgs` names).
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
    **_INFERENCE_SHORT_NAMES,
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
            _positive(self.candidate_topk_blocks, "candidate_topk_blocks", int)
            _positive(self.candidate_block_size, "candidate_block_size", int)
        if len(self.engram_num_embeddings) not in (0, len(self.engram_layer_ids)):
            raise ConfigError("config field `engram_num_embeddings` needs one entry per `engram_layer_ids` entry")
        for s in self.engram_layer_ids:
            if not 0 <= s < n_layers:
                raise ConfigError(f"config field `engram_layer_ids` lists layer {s}, outside the {n_layers} layers")
        if self.engram_layer_ids:
            for name in ("engram_max_ngram_size", "engram_n_heads", "engram_head_dim",
                         "engram_compressed_vocab_size"):
                _positive(getattr(self, name), name, int)


def _is_v41(raw: dict[str, Any]) -> bool:
    return ("text_config" in raw or raw.get("model_type") in ("deepseek_v41", "deepseek_v41_text")
            or "kv_source_layers" in raw or "kv_source_layer_ids" in raw)


def _v41_merge_flat(raw: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
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


def _v41_prepare(raw: dict[str, Any]) -> tuple[dict[str, Any], V41Config]:
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
        return tuple(_number(v, f"{name}[{i}]", int) for i, v in enumerate(value))

    def opt_int(name: str, default: Any) -> Any:
        value = raw.get(name, default)
        return None if value is None else _number(value, name, int)

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
    n_layers = _positive(raw.get("num_hidden_layers"), "num_hidden_layers", int)
    v41.validate(n_layers)
    for name in list(raw):
        if name in {f.name for f in dataclasses.fields(V41Config)}:
            raw.pop(name)
    return raw, v41
