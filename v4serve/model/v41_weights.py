"""Build a DeepSeek-V4.1 model from an official-format checkpoint (FP8 32x32 / MXFP4 experts).

Official names (`layers.L.attn.wq_a.weight` + `.scale`, ...) map onto our module tree by
`V41_LAYER_NAMES` / `V41_TOP_NAMES`; FP8 and MXFP4 tensors are dequantized exactly (`v41_quant.py`)
into the model dtype, and every GEMM the reference runs in FP8 / FP4 gets its input rounded as the
reference's does (`quantize_linear_inputs`: a transformation of the built model). Every tensor must
be used and every parameter filled; problems are listed together in one `WeightsError`.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from v4serve.config import ModelConfig
from v4serve.model.csa2 import SourceCompressor
from v4serve.model.deepseek_v4 import DeepseekV4ForCausalLM
from v4serve.model.engram import engram_tables_in_host_memory
from v4serve.model.engram_hash import compressed_token_map
from v4serve.model.v41_quant import act_quant, dequant_fp8_blocks, dequant_mxfp4, quantize_linear_inputs
from v4serve.model.safetensors_files import WeightsError, checkpoint_files
from v4serve.model.weights import compact_names

V41_TOP_NAMES = {
    "embed.weight": "model.embed_tokens.weight",
    "head.weight": "lm_head.weight",
    "norm.weight": "model.norm.weight",
}
V41_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    **{f"hc_{s}_{p}": f"{s}_hc.{p}" for s in ("attn", "ffn") for p in ("fn", "base", "scale")},
    "attn.wq_a.weight": "self_attn.q_a_proj.weight",
    "attn.q_norm.weight": "self_attn.q_a_norm.weight",
    "attn.wq_b.weight": "self_attn.q_b_proj.weight",
    "attn.wkv.weight": "self_attn.kv_proj.weight",
    "attn.kv_norm.weight": "self_attn.kv_norm.weight",
    "attn.wo_a.weight": "self_attn.o_a_proj.weight",
    "attn.wo_b.weight": "self_attn.o_b_proj.weight",
    "attn.attn_sink": "self_attn.sinks",
    "attn.compressor.wkv.weight": "self_attn.compressor.kv_proj.weight",
    "attn.compressor.wgate.weight": "self_attn.compressor.gate_proj.weight",
    "attn.compressor.norm.weight": "self_attn.compressor.kv_norm.weight",
    "attn.indexer.wq_b.weight": "self_attn.indexer.q_b_proj.weight",
    "attn.indexer.weights_proj.weight": "self_attn.indexer.weights_proj.weight",
    "attn.indexer.wk.weight": "self_attn.indexer.wk.weight",
    "attn.indexer.k_norm.weight": "self_attn.indexer.k_norm.weight",
    "ffn.gate.weight": "mlp.gate.weight",
    "ffn.gate.bias": "mlp.gate.e_score_correction_bias",
    "ffn.shared_experts.w1.weight": "mlp.shared_experts.gate_proj.weight",
    "ffn.shared_experts.w3.weight": "mlp.shared_experts.up_proj.weight",
    "ffn.shared_experts.w2.weight": "mlp.shared_experts.down_proj.weight",
}
_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^ffn\.experts\.(\d+)\.(w1|w2|w3)\.weight$")
_ENGRAM = re.compile(r"^engram\.(embed\.weight|embed\.scale|wkv\.weight|q_weight|k_weight)$")
_ENGRAM_TARGETS = {"embed.weight": "table", "embed.scale": "table_scale", "wkv.weight": "wkv.weight",
                   "q_weight": "q_weight", "k_weight": "k_weight"}
# Kept in fp32 whatever the model dtype: mHC, sinks, the router bias, ratio-2 compressor projections.
_FP32 = ("attn_hc.", "ffn_hc.", ".sinks", "e_score_correction_bias")
# Modules whose input the reference rounds to fp8 (e4m3 / ue8m0 per 32) before its FP8 GEMM.
_FP8_GEMM_INPUTS = ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_proj", "self_attn.o_b_proj",
                    "self_attn.indexer.q_b_proj", "mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj",
                    "mlp.shared_experts.down_proj")


def v41_target(key: str, config: ModelConfig) -> tuple[str, int | None, slice | None] | None:
    """(parameter name, expert, rows) for an official V4.1 tensor name (its `.weight` name for a
    `.scale`); None if unknown."""
    if key in V41_TOP_NAMES:
        return V41_TOP_NAMES[key], None, None
    m = _LAYER.match(key)
    if m is None:
        return None
    layer, rest = int(m.group(1)), m.group(2)
    prefix = f"model.layers.{layer}."
    if rest in V41_LAYER_NAMES:
        return prefix + V41_LAYER_NAMES[rest], None, None
    e = _EXPERT.match(rest)
    if e is not None:
        expert, which = int(e.group(1)), e.group(2)
        i = config.moe_intermediate_size
        if which == "w2":
            return prefix + "mlp.experts.down_proj", expert, None
        return prefix + "mlp.experts.gate_up_proj", expert, slice(0, i) if which == "w1" else slice(i, 2 * i)
    g = _ENGRAM.match(rest)
    if g is not None:
        return f"{prefix}engram.{_ENGRAM_TARGETS[g.group(1)]}", None, None
    return None


def build_v41_model(path: str | Path, config: ModelConfig, device: torch.device | str, dtype: torch.dtype,
                    token_map: torch.Tensor | None = None) -> DeepseekV4ForCausalLM:
    """The model with the checkpoint's weights, its FP8 GEMM inputs rounded as the reference's."""
    path = Path(path)
    if token_map is None and config.v41.engram_layer_ids:
        token_map = tokenizer_token_map(path)
    with torch.device("meta"):
        net = DeepseekV4ForCausalLM(config)
    keep32 = v41_fp32_parameters(net)
    for name, p in net.named_parameters():
        if p.is_floating_point() and name not in keep32:
            p.data = p.data.to(dtype)
    with engram_tables_in_host_memory(net, pinned=torch.device(device).type == "cuda"):
        net.to_empty(device=device)
    with torch.no_grad():
        for name, b in net.named_buffers():
            if name.endswith("position_bias"):
                b.zero_()
    if token_map is not None:
        net.set_token_map(token_map)
    load_v41_weights(net, path, config)
    for name, module in net.named_modules():
        if name.split("model.layers.")[-1].split(".", 1)[-1] in _FP8_GEMM_INPUTS:
            quantize_linear_inputs(module)
        if name.endswith("mlp.experts"):
            module.act_quant, module.weight_before_down = act_quant, True
    return net.eval()


def v41_fp32_parameters(net: torch.nn.Module) -> set[str]:
    """Parameters kept in fp32 whatever the model dtype: mHC, sinks, the router bias, and the gated
    (ratio-2) compressors' projections, which the reference promotes to fp32."""
    gated = {f"{n}.{w}.weight" for n, m in net.named_modules()
             if isinstance(m, SourceCompressor) and m.gate_proj is not None for w in ("kv_proj", "gate_proj")}
    return {name for name, _ in net.named_parameters() if any(f in name for f in _FP32) or name in gated}


def tokenizer_token_map(path: Path) -> torch.Tensor:
    from v4serve.tokenizer import Tokenizer

    tok = Tokenizer.for_model(path)
    return compressed_token_map(lambda i: tok.decode([i], skip_special_tokens=False), tok.vocab_size)


def load_v41_weights(net: torch.nn.Module, path: Path, config: ModelConfig) -> None:
    params = dict(net.named_parameters()) | dict(net.named_buffers())
    filled: dict[str, set] = {n: set() for n, _ in net.named_parameters()}
    filled.update({n: set() for n in params if n.endswith((".table", ".table_scale"))})
    unexpected, bad_shape = [], []
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt") as f:
            keys = set(f.keys())
            if not any(v41_target(k, config) for k in keys):
                continue  # not a weights shard (a checkpoint folder may hold other safetensors data)
            for key in sorted(keys):
                if key.endswith(".scale") and key[: -len(".scale")] + ".weight" in keys and "engram.embed" not in key:
                    continue  # read with its weight
                target = v41_target(key, config)
                if target is None or target[0] not in params:
                    unexpected.append(key)
                    continue
                name, expert, rows = target
                tensor = f.get_tensor(key)
                scale_key = key[: -len(".weight")] + ".scale"
                if scale_key in keys and "engram.embed" not in key:
                    scale = f.get_tensor(scale_key)
                    if tensor.dtype == torch.int8:
                        tensor = dequant_mxfp4(tensor, scale, dtype=torch.float32)
                    else:
                        tensor = dequant_fp8_blocks(tensor, scale, config_block(config), dtype=torch.float32)
                dest = params[name]
                if expert is not None:
                    dest = dest[expert]
                if rows is not None:
                    dest = dest[rows]
                if tuple(tensor.shape) != tuple(dest.shape):
                    bad_shape.append(f"{key}: checkpoint {tuple(tensor.shape)}, model {tuple(dest.shape)}")
                    continue
                if dest.dtype == torch.uint8 and tensor.dtype == torch.float8_e8m0fnu:
                    tensor = tensor.view(torch.uint8)  # ue8m0 scales kept as their exponent bytes
                with torch.no_grad():
                    dest.copy_(tensor if dest.dtype == tensor.dtype else tensor.float().to(dest.dtype))
                filled.setdefault(name, set()).add((expert, None if rows is None else rows.start))
    e = config.n_routed_experts
    missing = []
    for name, parts in filled.items():
        need = 2 * e if name.endswith("gate_up_proj") else e if name.endswith("down_proj") and ".experts." in name else 1
        if len(parts) < need:
            missing.append(name)
    problems = [
        f"{what} ({len(names)}):" + "".join(f"\n    {line}" for line in compact_names(names))
        for what, names in (("missing tensors", missing), ("unexpected tensors", unexpected),
                            ("tensors with the wrong shape", bad_shape)) if names
    ]
    if problems:
        raise WeightsError(f"checkpoint {path} does not match the DeepSeek-V4.1 config:\n  " + "\n  ".join(problems))


def config_block(config: ModelConfig) -> int:
    """The FP8 weight tile edge from `quantization_config.weight_block_size` (V4.1: 32)."""
    q = config.extra.get("quantization_config") or {}
    block = q.get("weight_block_size", [32, 32])
    if not isinstance(block, list) or len(block) != 2 or block[0] != block[1]:
        raise WeightsError(f"config field `quantization_config.weight_block_size` must be [b, b], got {block!r}")
    return int(block[0])
