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

One job a file, in import order:

* `fields.py`: ConfigError and the number readers that name the bad field;
* `geometry.py`: the layer-type names (SLIDING, CSA, HCA, CSA2) and YarnScaling;
* `short_names.py`: the reference `inference/config.json` short names -> our field names;
* `quantization.py`: QuantConfig (`quantization_config`, `expert_dtype`) and the `quantization=` override;
* `v41.py`: DeepSeek-V4.1 (V41Config, its layer roles, `text_config` and the flat reference names);
* `spellings.py`: reading the config files, the three spellings -> ModelConfig's fields;
* `model_config.py`: ModelConfig (fields, validation, `to_hf_dict`) with `from_pretrained` / `from_dict`.
"""

from v4serve.config.fields import ConfigError
from v4serve.config.geometry import CSA, CSA2, HCA, LAYER_TYPES, MLP_LAYER_TYPES, SLIDING, YarnScaling
from v4serve.config.model_config import ModelConfig
from v4serve.config.quantization import EXPERT_DTYPES, QUANTIZATION_CHOICES, QuantConfig, apply_quantization_override
from v4serve.config.v41 import V41_ROLES, V41Config

__all__ = [
    "CSA", "CSA2", "EXPERT_DTYPES", "HCA", "LAYER_TYPES", "MLP_LAYER_TYPES", "QUANTIZATION_CHOICES", "SLIDING",
    "V41_ROLES", "ConfigError", "ModelConfig", "QuantConfig", "V41Config", "YarnScaling", "apply_quantization_override",
]
