"""ModelConfig: the three spellings of config.json, validation errors naming the field, presets."""

from __future__ import annotations

import json

import pytest

from v4serve.config import CSA, HCA, SLIDING, ConfigError, ModelConfig
from v4serve.presets import preset_config

FLASH_OFFICIAL = {  # as the official V4-Flash checkpoint writes it (legacy names)
    "model_type": "deepseek_v4", "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43,
    "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
    "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8, "sliding_window": 128,
    "compress_ratios": [0, 0] + [4, 128] * 20 + [4, 0], "num_hash_layers": 3, "num_nextn_predict_layers": 1,
    "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "n_routed_experts": 256,
    "num_experts_per_tok": 6, "n_shared_experts": 1, "moe_intermediate_size": 2048,
    "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus", "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "rope_scaling": {"type": "yarn", "factor": 16, "beta_fast": 32, "beta_slow": 1,
                     "original_max_position_embeddings": 65536},
    "rms_norm_eps": 1e-6, "max_position_embeddings": 1048576, "eos_token_id": 1,
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                            "weight_block_size": [128, 128], "activation_scheme": "dynamic"},
    "expert_dtype": "fp4",
}
FLASH_LAYER_TYPES = [SLIDING, SLIDING] + [CSA, HCA] * 20 + [CSA]  # FLASH_OFFICIAL's ratios, transformers' way


def test_official_legacy_names():
    c = ModelConfig.from_dict(FLASH_OFFICIAL)
    assert c.num_hidden_layers == 43 and len(c.compress_ratios) == 43  # MTP entry dropped
    assert c.layer_types[:4] == (SLIDING, SLIDING, CSA, HCA)
    assert c.mlp_layer_types[:4] == ("hash_moe",) * 3 + ("moe",)
    assert c.qk_rope_head_dim == 64 and c.compress_yarn.factor == 16
    assert c.compress_yarn.original_max_position_embeddings == 65536
    assert c == preset_config("deepseek-v4-flash")


def test_transformers_spelling_round_trips():
    c = preset_config("tiny")
    again = ModelConfig.from_dict(json.loads(json.dumps(c.to_hf_dict())))
    assert again == c


def test_transformers_written_config_is_read(tmp_path):
    from transformers import DeepseekV4Config

    hf = DeepseekV4Config(
        num_hidden_layers=3, layer_types=[SLIDING, CSA, HCA], compress_rates={CSA: 4, HCA: 16},
        mlp_layer_types=["hash_moe", "moe", "moe"], hidden_size=64, head_dim=64, partial_rotary_factor=0.25,
        rope_parameters={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 256},
    )
    hf.save_pretrained(tmp_path)
    c = ModelConfig.from_pretrained(tmp_path)
    assert c.compress_ratios == (0, 4, 16) and c.qk_rope_head_dim == 16
    assert c.compress_yarn.factor == 8.0 and c.compress_yarn.original_max_position_embeddings == 256


def test_inference_short_names_fill_in(tmp_path):
    raw = dict(FLASH_OFFICIAL)
    short = {"dim": raw.pop("hidden_size"), "n_heads": raw.pop("num_attention_heads"),
             "moe_inter_dim": raw.pop("moe_intermediate_size"), "n_activated_experts": raw.pop("num_experts_per_tok")}
    (tmp_path / "inference").mkdir()
    (tmp_path / "inference" / "config.json").write_text(json.dumps(short))
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert ModelConfig.from_pretrained(tmp_path) == preset_config("deepseek-v4-flash")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"num_attention_heads": -4}, "num_attention_heads"),
        ({"compress_ratios": [0, 4]}, "compress_ratios"),
        ({"compress_ratios": [0, 0] + [4, 7] * 20 + [4, 0]}, "compress_ratios"),
        ({"o_groups": 7}, "o_groups"),
        ({"qk_rope_head_dim": 1024}, "qk_rope_head_dim"),
        ({"model_type": "llama"}, "model_type"),
        ({"scoring_func": "relu"}, "scoring_func"),
        ({"rope_scaling": {"type": "yarn", "factor": 16}}, "original_max_position_embeddings"),
        ({"num_experts_per_tok": 300}, "num_experts_per_tok"),
        # Non-numbers: a ConfigError naming the field and the value, not a bare float() ValueError.
        ({"routed_scaling_factor": "fast"}, "`routed_scaling_factor` must be a number, got 'fast'"),
        ({"rope_theta": "1e4"}, "`rope_theta` must be a number, got '1e4'"),
        ({"hc_eps": [1e-6]}, "`hc_eps` must be a number, got \\[1e-06\\]"),
        ({"rms_norm_eps": float("nan")}, "`rms_norm_eps` must be a number, got nan"),
        ({"compress_ratios": [0, "four"] + [4, 128] * 21}, "`compress_ratios\\[1\\]` must be an integer, got 'four'"),
        ({"compress_rates": {HCA: "128"}}, f"`compress_rates.{HCA}` must be an integer, got '128'"),
        ({"qk_rope_head_dim": None, "partial_rotary_factor": "1/8"},
         "`partial_rotary_factor` must be a number, got '1/8'"),
        ({"rope_scaling": {**FLASH_OFFICIAL["rope_scaling"], "beta_fast": "32"}},
         "`rope_scaling.beta_fast` must be a number, got '32'"),
        ({"num_hash_layers": 3.5}, "`num_hash_layers` must be an integer, got 3.5"),
        ({"n_shared_experts": True}, "`n_shared_experts` must be an integer, got True"),
        ({"hidden_size": "4096"}, "`hidden_size` must be an integer, got '4096'"),
        # Out of range.
        ({"swiglu_limit": 0}, "`swiglu_limit` must be a positive number, got 0"),
        ({"rms_norm_eps": -1e-6}, "`rms_norm_eps` must be a positive number, got -1e-06"),
        ({"rope_theta": 0.0}, "`rope_theta` must be a positive number, got 0.0"),
        ({"routed_scaling_factor": -1.5}, "`routed_scaling_factor` must be a positive number, got -1.5"),
        ({"rope_scaling": {**FLASH_OFFICIAL["rope_scaling"], "factor": -16}},
         "`rope_scaling.factor` must be a positive number, got -16"),
        ({"num_hash_layers": -1}, "`num_hash_layers` must be a non-negative integer, got -1"),
        ({"qk_rope_head_dim": None, "partial_rotary_factor": 1.5},
         "`partial_rotary_factor` must be in \\(0, 1\\], got 1.5"),
        ({"eos_token_id": [1, -1]}, "`eos_token_id` must be a non-negative integer, got -1"),
        # The transformers spelling contradicting the legacy one.
        ({"layer_types": FLASH_LAYER_TYPES[:2] + [HCA] + FLASH_LAYER_TYPES[3:]},
         "`layer_types`/`compress_rates` give layer 2 compress ratio 128 but the legacy `compress_ratios` gives 4"),
        ({"compress_rates": {HCA: 64}},
         "`layer_types`/`compress_rates` give layer 3 compress ratio 64 but the legacy `compress_ratios` gives 128"),
    ],
)
def test_bad_fields_are_named(change, field):
    raw = {**FLASH_OFFICIAL, **change}
    raw = {k: v for k, v in raw.items() if v is not None}
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_dict(raw)


def test_both_layer_spellings_are_accepted_when_they_agree():
    both = {**FLASH_OFFICIAL, "layer_types": FLASH_LAYER_TYPES, "compress_rates": {CSA: 4, HCA: 128}}
    assert ModelConfig.from_dict(both) == preset_config("deepseek-v4-flash")


def test_swiglu_limit_has_no_off_spelling():
    """The experts always clamp: a missing limit is transformers' default, null is not "no limit"."""
    missing = {k: v for k, v in FLASH_OFFICIAL.items() if k != "swiglu_limit"}
    assert ModelConfig.from_dict(missing).swiglu_limit == 10.0
    with pytest.raises(ConfigError, match="`swiglu_limit` must be a number, got None"):
        ModelConfig.from_dict({**FLASH_OFFICIAL, "swiglu_limit": None})


def test_inconsistent_layer_types(tmp_path):
    raw = {**FLASH_OFFICIAL, "layer_types": [SLIDING] * 42 + ["dense_attention"]}
    with pytest.raises(ConfigError, match="layer_types"):
        ModelConfig.from_dict(raw)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_pretrained(tmp_path)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown model preset 'huge'.*tiny"):
        preset_config("huge")


def test_ratio_must_divide_the_window():
    with pytest.raises(ConfigError, match="must divide `sliding_window`"):
        preset_config("tiny", {"compress_rates": {CSA: 4, HCA: 24}})
