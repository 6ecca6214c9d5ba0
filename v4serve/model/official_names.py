"""The official DeepSeek-V4 checkpoint's tensor names mapped onto ours (transformers' names), by
ONE declared table a scope (`OFFICIAL_LAYER_NAMES`, `OFFICIAL_TOP_NAMES`, `OFFICIAL_MTP_NAMES`) plus
the per-expert rule (`official_expert_target`: w1 / w3 are the halves of the fused `gate_up_proj`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from v4serve.config import ModelConfig

# Official suffix under `layers.N.` -> transformers suffix under `model.layers.N.`.
OFFICIAL_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "hc_attn_fn": "attn_hc.fn",
    "hc_attn_base": "attn_hc.base",
    "hc_attn_scale": "attn_hc.scale",
    "hc_ffn_fn": "ffn_hc.fn",
    "hc_ffn_base": "ffn_hc.base",
    "hc_ffn_scale": "ffn_hc.scale",
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.norm.weight": "self_attn.kv_norm.weight",  # how transformers' save_pretrained spells it
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.ape": "self_attn.compressor.position_bias",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.compressor.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.compressor.indexer.scorer.weights_proj.weight",
    "attn.indexer.compressor.wkv.weight": "self_attn.compressor.indexer.kv_proj.weight",
    "attn.indexer.compressor.wgate.weight": "self_attn.compressor.indexer.gate_proj.weight",
    "attn.indexer.compressor.ape": "self_attn.compressor.indexer.position_bias",
    "attn.indexer.compressor.norm.weight": "self_attn.compressor.indexer.kv_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.gate.tid2eid": "mlp.gate.tid2eid",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
OFFICIAL_TOP_NAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
    "hc_head_fn": "model.hc_head.hc_fn",
    "hc_head_base": "model.hc_head.hc_base",
    "hc_head_scale": "model.hc_head.hc_scale",
}
# The MTP layer's own tensors under `mtp.N.` (its block's tensors use the layer names above).
OFFICIAL_MTP_NAMES = {
    "e_proj.weight": "e_proj.weight", "h_proj.weight": "h_proj.weight", "enorm.weight": "enorm.weight",
    "hnorm.weight": "hnorm.weight", "norm.weight": "norm.weight", "hc_head_fn": "hc_head.hc_fn",
    "hc_head_base": "hc_head.hc_base", "hc_head_scale": "hc_head.hc_scale",
}
_OFFICIAL_MTP = re.compile(r"^mtp\.(\d+)\.(.+)$")
_OFFICIAL_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_OFFICIAL_EXPERT = re.compile(r"^layers\.(\d+)\.ffn\.experts\.(\d+)\.(w1|w2|w3)\.weight$")


@dataclass(frozen=True)
class Target:
    """Where a checkpoint tensor goes: a parameter, or a slice `[expert, rows]` of a fused one."""

    name: str
    expert: int | None = None
    rows: slice | None = None


def official_expert_target(layer: int, expert: int, which: str, intermediate: int,
                           block: str = "model.layers.{}") -> Target:
    """w1 (gate) and w3 (up) are the two halves of the fused `gate_up_proj`; w2 is `down_proj`."""
    prefix = block.format(layer) + ".mlp.experts."
    if which == "w2":
        return Target(prefix + "down_proj", expert)
    half = slice(0, intermediate) if which == "w1" else slice(intermediate, 2 * intermediate)
    return Target(prefix + "gate_up_proj", expert, half)


def official_target(name: str, config: ModelConfig) -> Target | None:
    """Map an official checkpoint name onto our parameter; None if it is not an official name.
    transformers' `save_pretrained` writes official per-layer names under a `model.` prefix."""
    name = name.removeprefix("model.")
    m = _OFFICIAL_MTP.match(name)
    if m:  # an MTP layer: its own tensors, or a decoder block's under official or our names
        rest = m[2]
        expert = _OFFICIAL_EXPERT.match("layers.0." + rest)
        if expert:
            return official_expert_target(int(m[1]), int(expert[2]), expert[3], config.moe_intermediate_size, "mtp.{}")
        return Target(f"mtp.{m[1]}." + OFFICIAL_MTP_NAMES.get(rest, OFFICIAL_LAYER_NAMES.get(rest, rest)))
    if name in OFFICIAL_TOP_NAMES:
        return Target(OFFICIAL_TOP_NAMES[name])
    m = _OFFICIAL_EXPERT.match(name)
    if m:
        return official_expert_target(int(m[1]), int(m[2]), m[3], config.moe_intermediate_size)
    m = _OFFICIAL_LAYER.match(name)
    if m and m[2] in OFFICIAL_LAYER_NAMES:
        return Target(f"model.layers.{m[1]}.{OFFICIAL_LAYER_NAMES[m[2]]}")
    return None
