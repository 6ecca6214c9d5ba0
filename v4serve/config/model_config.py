"""ModelConfig: the frozen, validated geometry of a DeepSeek-V4 model, and its transformers
spelling (`to_hf_dict`). Reading config.json into it is spellings.py's job."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from v4serve.config.fields import ConfigError, number_field, positive_field
from v4serve.config.geometry import CSA, HCA, LAYER_TYPES, MLP_LAYER_TYPES, SLIDING, YarnScaling
from v4serve.config.quantization import QuantConfig
from v4serve.config.spellings import read_raw, resolve_fields
from v4serve.config.v41 import V41Config


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
    num_nextn_predict_layers: int = 0  # MTP layers in the checkpoint (`mtp.N.*`; the draft of speculative decoding)
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
            positive_field(getattr(self, name), name, int)
        # `swiglu_limit` too: the experts always clamp, there is no "no limit" spelling (a missing
        # field is transformers' default, 10).
        for name in ("routed_scaling_factor", "swiglu_limit", "hc_eps", "rms_norm_eps", "rope_theta",
                     "compress_rope_theta"):
            positive_field(getattr(self, name), name)
        token_ids = (("bos_token_id", self.bos_token_id), *(("eos_token_id", t) for t in self.eos_token_ids))
        for name, value in (("n_shared_experts", self.n_shared_experts), *token_ids):
            if number_field(value, name, int) < 0:
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
        return cls.from_dict(read_raw(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> "ModelConfig":
        """Resolve the transformers / official / short spellings into one validated config."""
        return cls(**resolve_fields(raw, {f.name for f in dataclasses.fields(cls)}))

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
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids[0] if len(self.eos_token_ids) == 1 else list(self.eos_token_ids),
            "tie_word_embeddings": self.tie_word_embeddings,
            **(self.quantization.to_hf_dict() if self.quantization is not None else {}),
        }
