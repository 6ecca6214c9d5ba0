"""Install the quantized modules into a built (meta) model: a build-time transformation.

Which modules: for a checkpoint, what its tensors are (an F8_E4M3 weight makes its linear an
`FP8Linear`, packed e2m1 experts make the layer's experts `MXFP4Experts`); for a preset, the
official layout (`OFFICIAL_FP8` below, MXFP4 experts when `expert_dtype` is fp4).

`o_a_proj` (the official `wo_a`) is FP8 on disk and multiplies each head group by its own row
block. The official inference code dequantizes it to BF16 when it converts the checkpoint; we keep
it FP8 (`FP8GroupedLinear`: half the bytes, 32 MB less a V4-Flash layer, weight-only numerics =
the official bf16 product up to the fp32 sum order) wherever each group's rows are whole scale
blocks (`grouped_fp8_fits`: every official V4 checkpoint), and dequantize it at load into the model
dtype otherwise (`DEQUANTIZE_AT_LOAD`), as the MTP input projections always are. DeepSeek-V4.1
checkpoints load through `v41_weights.py` (every weight dequantized); its presets keep o_a_proj bf16.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from v4serve.config import ModelConfig, QuantConfig
from v4serve.model.quantized import FP8GroupedLinear, FP8Linear, MXFP4Experts
from v4serve.model.v41_quant import ACT_BLOCK, act_quant
from v4serve.ops.fp8_grouped_linear import groups_are_whole_blocks

# Linears that run as `module(x)` and may be FP8: the official checkpoint's FP8 set (suffixes
# under `model.layers.N.`).
OFFICIAL_FP8 = (
    "self_attn.q_a_proj", "self_attn.q_b_proj", "self_attn.kv_proj", "self_attn.o_b_proj",
    "self_attn.compressor.indexer.q_b_proj",
    "mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj", "mlp.shared_experts.down_proj",
    "self_attn.indexer.q_b_proj", "engram.wkv",  # DeepSeek-V4.1's indexer and Engram
)
# The grouped output projection: FP8 where `grouped_fp8_fits`, dequantized at load otherwise.
GROUPED_FP8 = "self_attn.o_a_proj"
# The MTP layer's input projections (`mtp.N.e_proj` / `h_proj`) are bf16 in our model as well.
DEQUANTIZE_AT_LOAD = (GROUPED_FP8, "e_proj", "h_proj")
EXPERTS = "mlp.experts"


def grouped_fp8_fits(config: ModelConfig) -> bool:
    """o_a_proj stays FP8 (`FP8GroupedLinear`): a V4 model with a quantization config whose row block
    divides o_lora_rank (each group's rows whole scale blocks). V4-Flash / Pro: 1024 rows of 128."""
    q = config.quantization
    return q is not None and config.v41 is None and groups_are_whole_blocks(config.o_lora_rank, q.weight_block_size)


def fp8_kind(suffix: str | None, config: ModelConfig) -> bool:
    """A module (by its layer suffix) that an FP8 checkpoint tensor makes an FP8 module."""
    return suffix in OFFICIAL_FP8 or (suffix == GROUPED_FP8 and grouped_fp8_fits(config))


def layer_suffix(module_name: str) -> str | None:
    """`model.layers.3.self_attn.q_a_proj` -> `self_attn.q_a_proj`; the MTP layers' blocks the same
    (`mtp.0.self_attn.q_a_proj` -> `self_attn.q_a_proj`); None outside the layers."""
    parts = module_name.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        return ".".join(parts[3:])
    if len(parts) > 2 and parts[0] == "mtp" and parts[1].isdigit():
        return ".".join(parts[2:])
    return None


@dataclass
class QuantPlan:
    """Module names (full dotted names) per treatment."""

    fp8: set[str] = field(default_factory=set)
    mxfp4: set[str] = field(default_factory=set)
    dequantize: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.fp8 or self.mxfp4 or self.dequantize)


def official_plan(net: nn.Module, config: ModelConfig) -> QuantPlan:
    """The official checkpoint's layout, for presets with `quantization` set."""
    plan = QuantPlan()
    q = config.quantization
    if q is None:
        return plan
    if q.expert_dtype == "fp8":
        raise ValueError("FP8 routed experts (expert_dtype fp8) are not supported yet; use fp4 or bf16")
    for name, _ in net.named_modules():
        suffix = layer_suffix(name)
        if fp8_kind(suffix, config):
            plan.fp8.add(name)
        elif suffix == EXPERTS and q.expert_dtype == "fp4":
            plan.mxfp4.add(name)
    return plan


def install(net: nn.Module, plan: QuantPlan, quant: QuantConfig | None, config: ModelConfig) -> None:
    """Swap the planned modules (on whatever device the model is; meta costs nothing).

    DeepSeek-V4.1 runs its reference's numerics whatever `quant.act_block` says: every FP8 GEMM
    input rounded to e4m3 / ue8m0 per 32 channels, and so are the expert GEMMs' inputs, with the
    routing weight applied before the down projection (`MXFP4Experts`)."""
    if plan.fp8 and quant is None:
        raise ValueError("FP8 modules need a quantization config (weight_block_size)")
    v41 = config.v41 is not None
    act_block = ACT_BLOCK if v41 else (quant.act_block if quant is not None else None)
    for name in sorted(plan.fp8 | plan.mxfp4):
        parent_name, _, child = name.rpartition(".")
        parent = net.get_submodule(parent_name)
        old = getattr(parent, child)
        with torch.device(next(old.parameters()).device):  # meta while building: no memory
            if name in plan.fp8 and layer_suffix(name) == GROUPED_FP8:
                new = FP8GroupedLinear(old.in_features, old.out_features, quant.weight_block_size)
            elif name in plan.fp8:
                new = FP8Linear(old.in_features, old.out_features, quant.weight_block_size, act_block)
            else:
                new = MXFP4Experts(config)
                if v41:
                    new.act_quant, new.weight_before_down = act_quant, True
        new.impl = getattr(old, "impl", "auto")  # model/kernels.py binds it again with the rest
        setattr(parent, child, new)
