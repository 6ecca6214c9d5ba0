"""DeepSeek-V4.1 configs: HF `text_config`, the reference's flat `inference_config.json`, roles."""

import json
from pathlib import Path

import pytest

from v4serve.config import CSA2, SLIDING, ConfigError, ModelConfig

GOLDEN = Path(__file__).parents[1] / "data" / "v41-golden"


def test_golden_config_loads_with_roles():
    c = ModelConfig.from_pretrained(GOLDEN)
    assert c.model_type == "deepseek_v41"
    assert c.compress_ratios == (0, 0, 2, 2, 1, 1, 1, 1)
    assert c.layer_types == (SLIDING, SLIDING) + (CSA2,) * 6
    assert c.mlp_layer_types == ("moe",) * 8  # no hash layers in V4.1
    assert c.rms_norm_eps == 1e-20 and c.hidden_size == 256 and c.qk_rope_head_dim == 32
    assert c.compress_yarn.factor == 4 and c.compress_yarn.original_max_position_embeddings == 32
    v = c.v41
    assert [v.role(i) for i in range(8)] == ["window", "window", "full", "reuse", "full", "reuse", "reindex", "reuse"]
    assert [v.kv_source(i) for i in range(8)] == [None, None, 2, 2, 4, 4, 4, 4]
    assert [v.index_source(i) for i in range(8)] == [None, None, 2, 2, 4, 4, 6, 6]
    assert [v.candidate_restricted(i) for i in range(8)] == [False] * 6 + [True, False]
    assert v.engram_layer_ids == (1, 2) and v.engram_num_embeddings == (1362, 1552)
    assert v.candidate_topk_blocks == 5 and v.candidate_block_size == 4


def test_flat_reference_names_give_the_same_model():
    hf = ModelConfig.from_pretrained(GOLDEN)
    flat = ModelConfig.from_dict(json.loads((GOLDEN / "inference_config.json").read_text()))
    # max_seq_len of the flat file is a runtime limit, not the model's position range.
    assert flat.replace(max_position_embeddings=hf.max_position_embeddings) == hf
    assert flat.v41 == hf.v41


def _raw():
    return json.loads((GOLDEN / "config.json").read_text())


@pytest.mark.parametrize("change, message", [
    ({"compress_ratios": [0, 0, 2, 2, 4, 1, 1, 1]}, "compress_ratios\\[4\\]"),
    ({"kv_source_layer_ids": [2, 0]}, "kv_source_layer_ids"),
    ({"kv_source_layer_ids": [3, 4], "index_source_layer_ids": [3, 4, 6]}, "layer 2 "),
    ({"candidate_source_layer_id": 6}, "candidate_source_layer_id"),
    ({"index_source_layer_ids": [4, 6]}, "index_source_layer_ids"),
    ({"engram_layer_ids": [1, 9]}, "engram_layer_ids"),
    ({"kv_source_layer_ids": None}, "kv_source_layer_ids"),
])
def test_bad_v41_fields_are_named(change, message):
    raw = _raw()
    raw["text_config"].update(change)
    with pytest.raises(ConfigError, match=message):
        ModelConfig.from_dict(raw)


def test_v4_config_still_refuses_other_model_types():
    with pytest.raises(ConfigError, match="model_type"):
        ModelConfig.from_dict({"model_type": "llama", "num_hidden_layers": 2})
