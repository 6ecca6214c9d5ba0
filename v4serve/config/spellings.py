"""Reading a checkpoint's config files and turning any of the three spellings of the DeepSeek-V4
geometry into ModelConfig's fields: transformers' (`layer_types`, `compress_rates`,
`mlp_layer_types`, nested `rope_parameters`, `partial_rotary_factor`), the official checkpoint's
(`compress_ratios`, `num_hash_layers`, `qk_rope_head_dim`, `rope_scaling`), and the reference
`inference/config.json` short names (short_names.py). A V4.1 config goes through v41.py first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from v4serve.config.fields import ConfigError, number_field, positive_field
from v4serve.config.geometry import CSA, HCA, LAYER_TYPES, SLIDING, YarnScaling
from v4serve.config.quantization import QUANT_FIELDS, QuantConfig
from v4serve.config.short_names import INFERENCE_SHORT_NAMES
from v4serve.config.v41 import is_v41, v41_merge_flat, v41_prepare

_RATIO_TO_LAYER_TYPE = {0: SLIDING, 4: CSA, 128: HCA}


def read_raw(path: str | Path) -> dict[str, Any]:
    """Read `config.json` (and `inference/config.json` when present) from a checkpoint folder: the raw
    dict for `resolve_fields`, the reference's short names translated."""
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
    if inference.is_file() and is_v41(raw):
        raw = v41_merge_flat(raw, json.loads(inference.read_text()))
    elif inference.is_file():
        short = json.loads(inference.read_text())
        raw = {**{INFERENCE_SHORT_NAMES[k]: v for k, v in short.items() if k in INFERENCE_SHORT_NAMES}, **raw}
    return raw


def resolve_fields(raw: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """Resolve the transformers / official / short spellings into ModelConfig's keyword arguments
    (`known`: its field names; the other keys go to `extra`)."""
    raw = dict(raw)
    v41 = None
    if is_v41(raw):  # DeepSeek-V4.1: see v41.py
        raw, v41 = v41_prepare(raw)
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
        return number_field(raw.get(name, default), name)

    n_layers = positive_field(need("num_hidden_layers"), "num_hidden_layers", int)
    layer_types, ratios = _resolve_layer_types(raw, n_layers) if v41 is None else v41.layer_types(n_layers)
    head_dim = need("head_dim")
    rope_theta, compress_theta, yarn = _resolve_rope(raw)
    eos = raw.get("eos_token_id", 1)
    eos_ids = tuple(eos) if isinstance(eos, list) else (eos,)
    return dict(
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
        num_nextn_predict_layers=number_field(raw.get("num_nextn_predict_layers", 0) or 0, "num_nextn_predict_layers", int),
        v41=v41,
        quantization=QuantConfig.from_raw(raw, (32, 32) if v41 is not None else (128, 128)),
        extra={k: v for k, v in raw.items() if k not in known and k not in QUANT_FIELDS},
    )


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
    ratios = tuple(number_field(r, f"compress_ratios[{i}]", int) for i, r in enumerate(ratios[:n]))
    bad = [r for r in ratios if r not in _RATIO_TO_LAYER_TYPE]
    if bad:
        raise ConfigError(f"config field `compress_ratios` has ratios {bad}; legacy configs allow 0, 4 and 128")
    return ratios


def _compress_rates(raw: dict[str, Any]) -> dict[str, int]:
    """Compress ratio per compressing layer type: `compress_rates` over transformers' defaults."""
    rates = raw.get("compress_rates") or {}
    if not isinstance(rates, dict):
        raise ConfigError(f"config field `compress_rates` must map layer types to ratios, got {rates!r}")
    return {CSA: 4, HCA: 128, **{t: number_field(r, f"compress_rates.{t}", int) for t, r in rates.items()}}


def _resolve_mlp_layer_types(raw: dict[str, Any], n: int) -> tuple[str, ...]:
    """`mlp_layer_types`, else legacy `num_hash_layers` hash-routed layers (default 3) then score-routed ones."""
    if raw.get("mlp_layer_types") is not None:
        types = raw["mlp_layer_types"]
        if not isinstance(types, list) or len(types) < n:
            raise ConfigError(f"config field `mlp_layer_types` must list {n} entries, got {types!r}")
        return tuple(types[:n])
    n_hash = number_field(raw.get("num_hash_layers", 3), "num_hash_layers", int)
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
    factor = number_field(factor, "partial_rotary_factor")
    if not 0 < factor <= 1:
        raise ConfigError(f"config field `partial_rotary_factor` must be in (0, 1], got {factor!r}")
    return int(number_field(head_dim, "head_dim", int) * factor)


def _resolve_rope(raw: dict[str, Any]) -> tuple[float, float, YarnScaling | None]:
    """(plain theta, compressed-layer theta, YaRN of the compressed layers) from nested
    `rope_parameters` (transformers) or flat `rope_theta`/`compress_rope_theta`/`rope_scaling`."""
    params = raw.get("rope_parameters") or {}
    if isinstance(params.get("main"), dict) and isinstance(params.get("compress"), dict):
        main, compress = params["main"], params["compress"]
        rope_theta = number_field(main.get("rope_theta", raw.get("rope_theta", 10000.0)), "rope_theta")
        compress_theta = number_field(compress.get("rope_theta", raw.get("compress_rope_theta", 160000.0)),
                                 "compress_rope_theta")
        scaling = compress if compress.get("rope_type", compress.get("type")) == "yarn" else None
    else:
        rope_theta = number_field(raw.get("rope_theta", 10000.0), "rope_theta")
        compress_theta = number_field(raw.get("compress_rope_theta", 160000.0), "compress_rope_theta")
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
    original = positive_field(original, "rope_scaling.original_max_position_embeddings", int)
    factor = scaling.get("factor")
    if factor is None:
        factor = positive_field(raw.get("max_position_embeddings", 1048576), "max_position_embeddings", int) / original
    yarn = YarnScaling(
        factor=positive_field(factor, "rope_scaling.factor"),
        original_max_position_embeddings=original,
        beta_fast=positive_field(scaling.get("beta_fast", 32), "rope_scaling.beta_fast"),
        beta_slow=positive_field(scaling.get("beta_slow", 1), "rope_scaling.beta_slow"),
    )
    return rope_theta, compress_theta, yarn
