"""Built-in model presets: configs with random weights (from a fixed seed) and no checkpoint.

* `tiny`: every layer type (sliding, CSA, HCA) and both MoE routings (hash, score), small enough
  to load and generate in a few seconds on a CPU. Used by the demo and the tests.
* `deepseek-v4-flash`, `deepseek-v4-pro`: the full published shapes in the official weight
  formats (FP8 e4m3 linears with ue8m0 128x128 block scales, MXFP4 routed experts), for GPU
  benchmarks: random codes and scales, so they measure what users of the checkpoints run. Pass
  `hf_overrides={"num_hidden_layers": 8}` to cut the depth, `quantization="none"` for bf16 weights.
  `tiny` stays bf16 unless asked (`quantization="fp8"`).
* `deepseek-v4.1-flash`: DeepSeek-V4.1-Flash's text model (architecture reference section 1.1
  and 8) in its official formats: FP8 e4m3 linears with ue8m0 32x32 blocks, MXFP4 experts, FP8
  Engram tables with ue8m0 scales per 32 channels, kept in host memory. No tokenizer: Engram
  hashes token ids through `id mod engram_compressed_vocab_size`. A depth cut keeps the layer
  roles, Engram tables and candidate source that fall inside it (`num_hidden_layers` 12: window
  layers 0-1, Engram before layer 1, kv sources 2 and 8). `engram_vocab_size` sets the tables'
  size (the default, 16M buckets per n-gram and head, is ~92 GiB per table: lower it where the
  host has less memory).
"""

from __future__ import annotations

from typing import Any

from v4serve.config import CSA, HCA, SLIDING, ModelConfig

_YARN = {"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
         "original_max_position_embeddings": 65536}

# config.json's fields of the official V4 / V4-Pro checkpoints.
_OFFICIAL_QUANTIZATION: dict[str, Any] = {
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    "expert_dtype": "fp4",
}

_COMMON_V4: dict[str, Any] = {
    "model_type": "deepseek_v4",
    "vocab_size": 129280,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "num_key_value_heads": 1,
    "sliding_window": 128,
    "index_n_heads": 64,
    "index_head_dim": 128,
    "num_experts_per_tok": 6,
    "n_shared_experts": 1,
    "scoring_func": "sqrtsoftplus",
    "num_hash_layers": 3,
    "swiglu_limit": 10.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": _YARN,
    "max_position_embeddings": 1048576,
    "bos_token_id": 0,
    "eos_token_id": 1,
    # One MTP layer, as the official checkpoints have: built only for speculative decoding.
    "num_nextn_predict_layers": 1,
}

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        **_COMMON_V4,
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "head_dim": 64,
        "qk_rope_head_dim": 16,
        "q_lora_rank": 32,
        "o_lora_rank": 32,
        "o_groups": 2,
        "sliding_window": 32,
        "layer_types": [SLIDING, CSA, HCA, CSA],
        "compress_rates": {CSA: 4, HCA: 16},
        "mlp_layer_types": ["hash_moe", "moe", "moe", "moe"],
        "index_n_heads": 4,
        "index_head_dim": 32,
        "index_topk": 8,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "routed_scaling_factor": 1.5,
        "rope_scaling": {**_YARN, "original_max_position_embeddings": 64},
        "max_position_embeddings": 4096,
    },
    "deepseek-v4-flash": {
        **_COMMON_V4,
        **_OFFICIAL_QUANTIZATION,
        "hidden_size": 4096,
        "num_hidden_layers": 43,
        "num_attention_heads": 64,
        "q_lora_rank": 1024,
        "o_lora_rank": 1024,
        "o_groups": 8,
        "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0],
        "index_topk": 512,
        "n_routed_experts": 256,
        "moe_intermediate_size": 2048,
        "routed_scaling_factor": 1.5,
    },
    "deepseek-v4-pro": {
        **_COMMON_V4,
        **_OFFICIAL_QUANTIZATION,
        "hidden_size": 7168,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "q_lora_rank": 1536,
        "o_lora_rank": 1024,
        "o_groups": 16,
        "compress_ratios": [128, 128] + [4, 128] * 29 + [4, 0],
        "index_topk": 1024,
        "n_routed_experts": 384,
        "moe_intermediate_size": 3072,
        "routed_scaling_factor": 2.5,
    },
}

# DeepSeek-V4.1-Flash (the HF config's `text_config` names). Engram's bucket count per n-gram size
# and head (`engram_vocab_size`) is UNCONFIRMED: 16,000,000 matches the ~183 GiB of its two tables
# (2 x 24 x 16M rows of 256 e4m3 codes); its DSpark draft stages are not modelled.
PRESETS["deepseek-v4.1-flash"] = {
    "model_type": "deepseek_v41",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [32, 32], "activation_scheme": "dynamic"},
    "expert_dtype": "fp4",
    "vocab_size": 129280,
    "hidden_size": 5120,
    "num_hidden_layers": 40,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1280,
    "o_lora_rank": 1024,
    "o_groups": 8,
    "sliding_window": 128,
    "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],  # the last 3: DSpark stages
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 2048,
    "candidate_block_size": 8,
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 512,
    "n_routed_experts": 384,
    "num_experts_per_tok": 6,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2304,
    "scoring_func": "sqrtsoftplus",
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.5,
    "swiglu_limit": 10.0,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "rms_norm_eps": 1e-20,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": {**_YARN, "rope_type": "yarn"},
    "max_position_embeddings": 1048576,
    "engram_layer_ids": [1, 14],
    "engram_max_ngram_size": 4,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_vocab_size": 16_000_000,
    "engram_compressed_vocab_size": 99092,
    "engram_pad_token_id": 2,
    "image_token_id": 129264,
    "bos_token_id": 0,
    "eos_token_id": 1,
}

# Fields that list layer ids (DeepSeek-V4.1): a depth cut keeps the layers inside it.
_LAYER_ID_LISTS = ("kv_source_layer_ids", "index_source_layer_ids", "engram_layer_ids")

PRESET_SEED = 0


def is_preset(name: str) -> bool:
    return name in PRESETS


def preset_config(name: str, overrides: dict[str, Any] | None = None) -> ModelConfig:
    """The config of a preset, with `overrides` (config.json field names) applied before validation."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; available presets: {', '.join(PRESETS)}")
    raw = {**PRESETS[name], **(overrides or {})}
    n = raw["num_hidden_layers"]
    # Per-layer lists longer than the (possibly overridden) depth are cut to it, and so are the
    # layer ids V4.1 lists (an Engram table's size goes with its layer).
    for key in ("layer_types", "mlp_layer_types", "compress_ratios"):
        if key in raw and isinstance(raw[key], list) and len(raw[key]) > n:
            raw[key] = raw[key][:n]
    if isinstance(raw.get("engram_num_embeddings"), list) and isinstance(raw.get("engram_layer_ids"), list):
        raw["engram_num_embeddings"] = [e for i, e in zip(raw["engram_layer_ids"], raw["engram_num_embeddings"]) if i < n]
    for key in _LAYER_ID_LISTS:
        if isinstance(raw.get(key), list):
            raw[key] = [i for i in raw[key] if isinstance(i, int) and i < n]
    if isinstance(raw.get("candidate_source_layer_id"), int) and raw["candidate_source_layer_id"] >= n:
        raw["candidate_source_layer_id"] = None
    return ModelConfig.from_dict(raw)
