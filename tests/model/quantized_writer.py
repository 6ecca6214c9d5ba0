"""Test helper: a tiny DeepSeek-V4 checkpoint written in the OFFICIAL quantized format, with its
own quantizer (nothing from v4serve), and the transformers oracle on the exactly dequantized weights.

Formats written (deepseek-v4-architecture.md section 1.2):
* FP8 linears: `X.weight` F8_E4M3 [N, K] + `X.scale` F8_E8M0 [ceil(N/bn), ceil(K/bk)]; per block
  s = 2^ceil(log2(amax / 448)) (a power of two), code = e4m3 round-to-nearest-even of w / s.
* Routed experts: `X.weight` I8 [N, K/2] packed e2m1 (element 2j in the low nibble) + `X.scale`
  F8_E8M0 [N, K/32]; per 32 along K, s = 2^ceil(log2(amax / 6)), code = nearest e2m1 of w / s,
  ties to the even code.
* Everything else as float32 (int32 for the hash tables), under the official names.

The quantizer rounds by searching a table of every representable value (built from the bit
formulas below), not by casting, so it is independent of torch's float8 casts and of v4serve.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from oracle import CSA, HCA

E4M3_MAX, E2M1_MAX = 448.0, 6.0
FP8_BLOCK = (16, 32)  # non-square, so a transposed scale would be caught; partial edge blocks below
# The official FP8 linears (transformers names under model.layers.N.); everything else stays float.
FP8_LINEARS = ("self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_proj", "self_attn.o_a_proj",
               "self_attn.o_b_proj", "self_attn.compressor.indexer.q_b_proj", "mlp.shared_experts.gate_proj",
               "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj")

# transformers name (under model.layers.N.) -> official name (under layers.N.), written by hand.
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "attn_hc.fn": "hc_attn_fn", "attn_hc.base": "hc_attn_base", "attn_hc.scale": "hc_attn_scale",
    "ffn_hc.fn": "hc_ffn_fn", "ffn_hc.base": "hc_ffn_base", "ffn_hc.scale": "hc_ffn_scale",
    "self_attn.q_a_proj.weight": "attn.wq_a.weight", "self_attn.q_a_norm.weight": "attn.q_norm.weight",
    "self_attn.q_b_proj.weight": "attn.wq_b.weight", "self_attn.kv_proj.weight": "attn.wkv.weight",
    "self_attn.kv_norm.weight": "attn.kv_norm.weight", "self_attn.o_a_proj.weight": "attn.wo_a.weight",
    "self_attn.o_b_proj.weight": "attn.wo_b.weight", "self_attn.sinks": "attn.attn_sink",
    "self_attn.compressor.kv_proj.weight": "attn.compressor.wkv.weight",
    "self_attn.compressor.gate_proj.weight": "attn.compressor.wgate.weight",
    "self_attn.compressor.position_bias": "attn.compressor.ape",
    "self_attn.compressor.kv_norm.weight": "attn.compressor.norm.weight",
    "self_attn.compressor.indexer.q_b_proj.weight": "attn.indexer.wq_b.weight",
    "self_attn.compressor.indexer.scorer.weights_proj.weight": "attn.indexer.weights_proj.weight",
    "self_attn.compressor.indexer.kv_proj.weight": "attn.indexer.compressor.wkv.weight",
    "self_attn.compressor.indexer.gate_proj.weight": "attn.indexer.compressor.wgate.weight",
    "self_attn.compressor.indexer.position_bias": "attn.indexer.compressor.ape",
    "self_attn.compressor.indexer.kv_norm.weight": "attn.indexer.compressor.norm.weight",
    "mlp.gate.weight": "ffn.gate.weight", "mlp.gate.e_score_correction_bias": "ffn.gate.bias",
    "mlp.gate.tid2eid": "ffn.gate.tid2eid",
    "mlp.shared_experts.gate_proj.weight": "ffn.shared_experts.w1.weight",
    "mlp.shared_experts.up_proj.weight": "ffn.shared_experts.w3.weight",
    "mlp.shared_experts.down_proj.weight": "ffn.shared_experts.w2.weight",
}
TOP_NAMES = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
             "model.norm.weight": "norm.weight", "model.hc_head.hc_fn": "hc_head_fn",
             "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}

# A model whose widths give partial FP8 blocks (o_lora_rank 24: o_b_proj K = 48 = 1.5 blocks of 32,
# o_a_proj N = 48 = 3 blocks of 16; q_lora_rank 40) and MXFP4-compatible expert widths (64, 32).
QUANT_CONFIG = dict(seed=7, layer_types=[CSA, HCA, CSA, HCA], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
                    compress_rates={CSA: 4, HCA: 32}, sliding_window=32, num_attention_heads=4, head_dim=128,
                    partial_rotary_factor=0.5, o_groups=2, index_topk=6, index_n_heads=16, index_head_dim=128,
                    q_lora_rank=40)


# ---------------------------------------------------------------------- the quantizer
def e4m3_value(code: int) -> float:
    """1 sign | 4 exponent (bias 7) | 3 mantissa; exponent 0 is subnormal; 0x7F/0xFF are NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return float("nan")
    return sign * (m * 2.0**-9 if e == 0 else 2.0 ** (e - 7) * (1 + m / 8))


E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7; bit 3 = sign


def round_to_codes(x: torch.Tensor, magnitudes: list[float], sign_bit: int) -> torch.Tensor:
    """Codes (int64) of the nearest representable value of each x (|x| within the largest), ties
    to the even code; magnitudes[c] is the value of positive code c, increasing."""
    mags = torch.tensor(magnitudes, dtype=torch.float64)
    a = x.double().abs()
    hi = torch.searchsorted(mags, a).clamp(max=len(magnitudes) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = a - mags[lo], mags[hi] - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0))
    code = torch.where(pick_hi, hi, lo)
    return code | torch.where(x < 0, sign_bit, 0)


def pow2_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """The smallest power of two s with amax / s <= qmax (amax floored at 2^-100)."""
    s = torch.exp2(torch.ceil(torch.log2(amax.double().clamp(min=2.0**-100) / qmax)))
    return torch.where(amax / s > qmax, s * 2, s)


def quantize_fp8(w: torch.Tensor, block=FP8_BLOCK):
    """(codes uint8 [N, K], scale exponent bytes uint8 [ceil(N/bn), ceil(K/bk)], dequantized fp32)."""
    n, k = w.shape
    bn, bk = block
    sn, sk = -(-n // bn), -(-k // bk)
    scale = torch.empty(sn, sk, dtype=torch.float64)
    for i in range(sn):
        for j in range(sk):
            scale[i, j] = pow2_scale(w[i * bn:(i + 1) * bn, j * bk:(j + 1) * bk].abs().max(), E4M3_MAX)
    full = scale.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    positive = [e4m3_value(c) for c in range(0x7F)]  # 0x00..0x7E, increasing
    codes = round_to_codes(w.double() / full, positive, 0x80)
    values = torch.tensor([e4m3_value(c) for c in range(256)], dtype=torch.float64)[codes]
    exps = (torch.log2(scale) + 127).round().to(torch.uint8)
    return codes.to(torch.uint8), exps, (values * full).float()


def quantize_mxfp4(w: torch.Tensor):
    """(packed uint8 [..., N, K/2], scale exponent bytes uint8 [..., N, K/32], dequantized fp32)."""
    blocks = w.double().reshape(*w.shape[:-1], w.shape[-1] // 32, 32)
    scale = pow2_scale(blocks.abs().amax(-1, keepdim=True), E2M1_MAX)
    codes = round_to_codes(blocks / scale, list(E2M1_MAGNITUDES), 8)
    signed = torch.tensor(E2M1_MAGNITUDES + tuple(-m for m in E2M1_MAGNITUDES), dtype=torch.float64)
    deq = (signed[codes] * scale).reshape(w.shape).float()
    codes = codes.reshape(w.shape)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)  # even element low
    exps = (torch.log2(scale.squeeze(-1)) + 127).round().to(torch.uint8)
    return packed, exps, deq


# ---------------------------------------------------------------------- the checkpoint
def make_quantized_oracle(path: Path, naming: str = "official", shards: int = 3, overrides: dict | None = None):
    """Write the checkpoint to `path`; return the transformers model holding the dequantized weights.
    naming "official": official names, F8_E8M0 scales, per-expert I8 tensors, scales in a shard
    other than their weights'; "transformers": transformers names, FP8 scales as fp32
    `weight_scale_inv`, fused packed experts `gate_up_proj` + `gate_up_proj_scale_inv`.
    `overrides`: config fields over QUANT_CONFIG."""
    from oracle import make_hf_model

    hf = make_hf_model("quantized", {**QUANT_CONFIG, **(overrides or {})})
    tensors: dict[str, torch.Tensor] = {}
    shard_of: dict[str, int] = {}
    state = hf.state_dict()
    with torch.no_grad():
        for name, t in state.items():
            layer = int(name.split(".")[2]) if name.startswith("model.layers.") else -1
            suffix = ".".join(name.split(".")[3:]) if layer >= 0 else name
            module = suffix.rpartition(".")[0]
            if module in FP8_LINEARS and suffix.endswith(".weight"):
                codes, exps, deq = quantize_fp8(t)
                t.copy_(deq)  # the oracle runs on exactly what the checkpoint holds
                _put_fp8(tensors, shard_of, name, layer, suffix, codes, exps, naming, shards)
            elif suffix in ("mlp.experts.gate_up_proj", "mlp.experts.down_proj"):
                packed, exps, deq = quantize_mxfp4(t)
                t.copy_(deq)
                _put_experts(tensors, shard_of, name, layer, suffix, packed, exps, naming, shards, t.shape[1] // 2)
            else:
                key = _official(name, layer, suffix) if naming == "official" else name
                value = t.to(torch.int32) if t.dtype == torch.int64 else t.contiguous()
                tensors[key] = value
                shard_of[key] = len(tensors) % shards
    _write_shards(path, tensors, shard_of, shards)
    config = hf.config.to_dict()
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": list(FP8_BLOCK),
                                     "activation_scheme": "dynamic", **({"scale_fmt": "ue8m0"} if naming == "official" else {})}
    config["expert_dtype"] = "fp4"
    (path / "config.json").write_text(json.dumps(config, indent=2, default=str))
    return hf.eval()


def _official(name: str, layer: int, suffix: str) -> str:
    return TOP_NAMES[name] if layer < 0 else f"layers.{layer}.{LAYER_NAMES[suffix]}"


def _put_fp8(tensors, shard_of, name, layer, suffix, codes, exps, naming, shards):
    if naming == "official":
        weight_key = _official(name, layer, suffix)
        scale_key = weight_key.removesuffix("weight") + "scale"
        scale = exps.view(torch.float8_e8m0fnu)
    else:
        weight_key, scale_key = name, name + "_scale_inv"
        scale = torch.exp2(exps.float() - 127)
    tensors[weight_key] = codes.view(torch.float8_e4m3fn)
    tensors[scale_key] = scale
    shard_of[weight_key] = layer % shards
    shard_of[scale_key] = (layer + 1) % shards  # the index file says where


def _put_experts(tensors, shard_of, name, layer, suffix, packed, exps, naming, shards, half):
    if naming != "official":
        tensors[name], tensors[name + "_scale_inv"] = packed, exps
        shard_of[name], shard_of[name + "_scale_inv"] = layer % shards, (layer + 2) % shards
        return
    for e in range(packed.shape[0]):
        parts = ({"w2": slice(None)} if suffix.endswith("down_proj")
                 else {"w1": slice(0, half), "w3": slice(half, 2 * half)})
        for which, rows in parts.items():
            base = f"layers.{layer}.ffn.experts.{e}.{which}."
            tensors[base + "weight"] = packed[e, rows].contiguous().view(torch.int8)
            tensors[base + "scale"] = exps[e, rows].contiguous().view(torch.float8_e8m0fnu)
            shard_of[base + "weight"] = (layer + e) % shards
            shard_of[base + "scale"] = (layer + e + 1) % shards


def _write_shards(path: Path, tensors, shard_of, shards: int) -> None:
    path.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: v.contiguous() for k, v in tensors.items() if shard_of[k] == i}
        save_file(part, str(path / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
