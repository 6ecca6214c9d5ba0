"""Build a model from a preset name or a checkpoint folder, on a device, in a dtype."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from v4serve.config import ModelConfig
from v4serve.model.deepseek_v4 import DeepseekV4ForCausalLM
from v4serve.model.weights import load_weights
from v4serve.presets import PRESET_SEED, PRESETS, is_preset, preset_config

# Parameters the reference keeps in fp32 whatever the model dtype (mHC, sinks, compressor and
# indexer-weight projections, gate biases): name fragments.
FP32_PARAMETERS = (
    "attn_hc.", "ffn_hc.", "hc_head.", ".sinks", "position_bias", "e_score_correction_bias",
    "compressor.kv_proj", "compressor.gate_proj", "indexer.kv_proj", "indexer.gate_proj", "weights_proj",
)


def resolve_config(model: str, overrides: dict[str, Any] | None = None) -> ModelConfig:
    if is_preset(model):
        return preset_config(model, overrides)
    path = Path(model)
    if not path.exists():
        raise ValueError(
            f"model {model!r} is neither a preset ({', '.join(PRESETS)}) nor an existing checkpoint folder"
        )
    config = ModelConfig.from_pretrained(path)
    return config.replace(**overrides) if overrides else config


def build_model(
    model: str, device: torch.device | str, dtype: torch.dtype, overrides: dict[str, Any] | None = None,
    progress: bool = True, shard: Callable[[DeepseekV4ForCausalLM], dict] | None = None,
) -> tuple[DeepseekV4ForCausalLM, ModelConfig]:
    """The model with weights: random (fixed seed) for presets, loaded for checkpoints.
    `shard` (`parallel/shard.py`) cuts the model to one rank's part before any memory is
    allocated; it returns the cuts, through which only this rank's weights are generated / read."""
    config = resolve_config(model, overrides)
    if config.v41 is not None:  # DeepSeek-V4.1: official-format checkpoints (model/v41_weights.py)
        if is_preset(model):
            raise ValueError(f"preset {model!r}: DeepSeek-V4.1 presets are not available yet")
        from v4serve.model.v41_weights import build_v41_model
        return build_v41_model(model, config, device, dtype), config
    with torch.device("meta"):
        net = DeepseekV4ForCausalLM(config)
    shards = shard(net) if shard is not None else None
    for name, p in net.named_parameters():  # still on "meta": costs no memory
        if p.is_floating_point() and not any(frag in name for frag in FP32_PARAMETERS):
            p.data = p.data.to(dtype)
    net.to_empty(device=device)
    if is_preset(model):
        init_random_weights(net, config, seed=PRESET_SEED, shards=shards)
    else:
        load_weights(net, model, config, progress=progress, shards=shards)  # fails unless every tensor is present
    net.eval()
    return net, config


@torch.no_grad()
def init_random_weights(net: DeepseekV4ForCausalLM, config: ModelConfig, seed: int,
                        shards: dict | None = None) -> None:
    """Deterministic random weights: N(0, 0.02) matrices, unit norms and mHC scales, zero biases,
    random hash-routing tables. Generated on the model's device, parameter by parameter; a cut
    parameter (`shards`) draws its full values and keeps its part, so every rank count gets the
    same model."""
    device = net.lm_head.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, t in list(net.named_parameters()) + list(net.named_buffers()):
        if name.endswith("tid2eid"):
            t.copy_(torch.randint(0, config.n_routed_experts, t.shape, generator=gen, device=device))
        elif name.endswith(("norm.weight", ".scale", "hc_scale")):
            t.fill_(1.0)
        elif name.endswith(("base", "hc_base", "sinks", "position_bias", "e_score_correction_bias")):
            t.zero_()
        else:  # slice by slice: a stacked expert tensor's fp32 temporary would not fit beside the model
            spec = shards.get(name) if shards else None
            shape = spec.full_shape if spec is not None else tuple(t.shape)
            for e in (range(shape[0]) if len(shape) == 3 else [None]):
                values = torch.randn(shape[1:] if e is not None else shape, generator=gen, device=device,
                                     dtype=torch.float32).mul_(0.02)
                if spec is not None:
                    spec.copy_part(t, e, values)
                else:
                    (t if e is None else t[e]).copy_(values)


def save_pretrained(net: DeepseekV4ForCausalLM, config: ModelConfig, path: str | Path) -> None:
    """Write `config.json` and `model.safetensors` in transformers' naming."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
    tensors = {k: v.contiguous() for k, v in net.state_dict().items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
