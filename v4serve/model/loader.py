"""Build a model from a preset name or a checkpoint folder, on a device, in a dtype (quantized
weights kept in their formats, routed experts optionally partly in host memory)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import torch

from v4serve.config import ModelConfig, apply_quantization_override
from v4serve.model.deepseek_v4 import FP8_DRAFT_HEAD_BLOCK, DeepseekV4ForCausalLM
from v4serve.model.engram import ENGRAM_TABLE_BUFFERS, Engram, engram_tables_in_host_memory
from v4serve.model.engram_hash import modulo_token_map
from v4serve.model.quantized import EXPERT_TENSORS, MXFP4Experts
from v4serve.model.quantized_install import install, official_plan
from v4serve.model.quantized_offload import ExpertOffload
from v4serve.model.quantized_placement import plan_placement
from v4serve.model.official_names import Target
from v4serve.model.weights import copy_weights, scan_checkpoint
from v4serve.ops.mxfp4_moe_decode import TENSOR_CORE_DECODE
from v4serve.ops.weight_formats import fp8_weight_bytes
from v4serve.presets import PRESET_SEED, PRESETS, is_preset, preset_config

# Parameters the reference keeps in fp32 whatever the model dtype (mHC, sinks, compressor and
# indexer-weight projections, gate biases): name fragments.
BF16_ON_DISK = ("compressor.kv_proj", "compressor.gate_proj", "indexer.kv_proj", "indexer.gate_proj", "weights_proj")
FP32_PARAMETERS = ("attn_hc.", "ffn_hc.", "hc_head.", ".sinks", "position_bias", "e_score_correction_bias",
                   *BF16_ON_DISK)


def resolve_config(model: str, overrides: dict[str, Any] | None = None, quantization: str | None = None) -> ModelConfig:
    """The config of a preset or checkpoint folder, `hf_overrides` applied, then `quantization`
    (which only overrides what config.json says: see `apply_quantization_override`)."""
    if is_preset(model):
        config = preset_config(model, overrides)
    else:
        path = Path(model)
        if not path.exists():
            raise ValueError(
                f"model {model!r} is neither a preset ({', '.join(PRESETS)}) nor an existing checkpoint folder"
            )
        config = ModelConfig.from_pretrained(path)
        config = config.replace(**overrides) if overrides else config
    return apply_quantization_override(config, quantization)


def build_model(
    model: str, device: torch.device | str, dtype: torch.dtype, overrides: dict[str, Any] | None = None,
    progress: bool = True, quantization: str | None = None, cpu_offload_gb: float | str = 0,
    reserve_bytes: int = 0, mtp: bool = False, shard: Callable[[DeepseekV4ForCausalLM], dict] | None = None,
    tensor_core_decode: bool | None = None, draft_head: str = "shared", device_bytes: int | None = None,
) -> tuple[DeepseekV4ForCausalLM, ModelConfig]:
    """The model with weights: random (fixed seed) for presets, loaded for checkpoints.

    Built on "meta" first (no memory); the quantized modules are installed as a transformation of
    that model (from the checkpoint's tensors, or the official layout for a quantized preset); a
    checkpoint is checked completely from its headers; then every tensor is allocated once, on
    `device` (or, for offloaded experts, in pinned host memory) and filled. A failure after
    allocation frees what was allocated before it propagates. The quantized modules are
    `UsesKernels`: `bind_kernels` picks their implementation with the rest. `mtp`: with the
    checkpoint's MTP layers (speculative decoding's draft; quantized like the decoder layers);
    `draft_head="fp8"`: their own FP8 copy of the lm head, made once the weights are in (its bytes
    are kept free when placing offloaded experts). `device_bytes`: what the model may take of the
    device when placing offloaded experts (None: its free memory; see `gpu_memory_utilization`).

    `shard` (`parallel/shard.py`) cuts the meta model to one tensor-parallel rank's part after the
    quantized modules are installed; it returns the cuts, through which only this rank's weights
    are generated / read (checked against the full shapes); quantized modules are cut on whole
    scale blocks (`parallel/shard_quantized.py`). Sharding offloaded experts is future work:
    refused (`refuse_unsupported`).

    `tensor_core_decode`: the MXFP4 experts' decode route (None: production's `TENSOR_CORE_DECODE`),
    bound with the loaded weights in hand (`MXFP4Experts.bind_decode`)."""
    device = torch.device(device)
    config = resolve_config(model, overrides, quantization)
    if config.v41 is not None and mtp:
        raise ValueError("speculative decoding with MTP: DeepSeek-V4.1's DSpark draft stages are not supported")
    if draft_head != "shared" and (not mtp or shard is not None):
        raise ValueError(f"draft_head={draft_head!r} needs the MTP layers (mtp=True) on one rank")
    if shard is not None:
        from v4serve.parallel.shard import refuse_unsupported
        refuse_unsupported(cpu_offload_gb)
    if config.v41 is not None:
        if shard is not None:
            raise NotImplementedError("tensor_parallel_size > 1 for DeepSeek-V4.1 is not supported yet (future work)")
        if cpu_offload_gb not in (0, None):
            raise NotImplementedError("cpu_offload_gb for DeepSeek-V4.1 is not supported yet (its experts apply the "
                                      "routing weight before the down projection; the offload passes do not)")
        if not is_preset(model):  # official-format checkpoints, dequantized exactly (model/v41_weights.py)
            from v4serve.model.v41_weights import build_v41_model
            return build_v41_model(model, config, device, dtype), config
    with torch.device("meta"):
        net = DeepseekV4ForCausalLM(config, mtp=mtp)
    keep32 = fp32_parameters(net, config)
    for name, p in net.named_parameters():  # still on "meta": costs no memory
        if p.is_floating_point() and name not in keep32:
            p.data = p.data.to(dtype)
    scan, shards = None, None
    if is_preset(model):
        install(net, official_plan(net, config), config.quantization, config)
        shards = shard(net) if shard is not None else None
    else:
        scan = scan_checkpoint(net, Path(model), config,
                               lambda plan: install(net, plan, config.quantization, config), shard=shard)
    if draft_head == "fp8":
        reserve_bytes += fp8_weight_bytes(config.vocab_size, config.hidden_size, FP8_DRAFT_HEAD_BLOCK)
    placement = plan_placement(net, config, cpu_offload_gb, device, reserve_bytes, free_bytes=device_bytes)
    offloads = {}
    try:
        for name, host in placement.host_experts.items():
            if not host:
                continue
            module = net.get_submodule(name)
            offloads[name] = ExpertOffload(module, host, min(placement.n_slots, len(host)) or 1, device)
            for tensor in EXPERT_TENSORS:  # now held by the offload, not allocated as parameters
                del module._parameters[tensor]
            module.offload = offloads[name]
        with engram_tables_in_host_memory(net, pinned=torch.device(device).type == "cuda"):
            _materialize(net, device)
        if scan is None:
            init_random_weights(net, config, seed=PRESET_SEED, shards=shards)
            if any(isinstance(m, Engram) for m in net.modules()):  # no tokenizer: a fixed token map
                net.set_token_map(modulo_token_map(config))
        else:
            cut = {"params": dict(net.named_parameters()) | dict(net.named_buffers())} if shard is not None else {}
            copy_weights(scan, _writer(net, offloads), device, progress=progress, **cut)
        if draft_head == "fp8":
            net.add_fp8_draft_head()
    except BaseException:
        net.to_empty(device="meta")
        for name in offloads:
            net.get_submodule(name).offload = None
        offloads.clear()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise
    tensor_cores = TENSOR_CORE_DECODE if tensor_core_decode is None else tensor_core_decode
    for module in net.modules():
        if isinstance(module, MXFP4Experts):
            module.bind_decode(tensor_cores)
    net.eval()
    return net, config


def _materialize(net: torch.nn.Module, device: torch.device) -> None:
    """`net.to_empty(device=device)` without `empty_like` on a contiguous "meta" tensor: that call
    runs torch's Python decomposition, whose first use imports sympy (~1 s of CPU in every process
    that builds a model). The tensors it allocates are the same."""
    net._apply(lambda t: torch.empty(t.shape, dtype=t.dtype, device=device) if t.is_contiguous()
               else torch.empty_like(t, device=device))


def fp32_parameters(net: torch.nn.Module, config: ModelConfig) -> set[str]:
    """Names of the parameters kept in fp32 whatever the model dtype."""
    if config.v41 is not None:
        from v4serve.model.v41_weights import v41_fp32_parameters
        return v41_fp32_parameters(net)
    return {name for name, _ in net.named_parameters() if any(frag in name for frag in FP32_PARAMETERS)}


def _writer(net: torch.nn.Module, offloads: dict[str, ExpertOffload]):
    """write(target, value): into the parameter, or expert by expert into an ExpertOffload."""
    params = dict(net.named_parameters()) | dict(net.named_buffers())

    def write(target: Target, value: torch.Tensor) -> None:
        module, _, tensor = target.name.rpartition(".")
        if module in offloads and tensor in EXPERT_TENSORS:
            experts = [target.expert] if target.expert is not None else range(value.shape[0])
            for i, e in enumerate(experts):
                dest = offloads[module].dest(tensor, e)
                part = value if target.expert is not None else value[i]
                (dest if target.rows is None else dest[target.rows]).copy_(part)
            return
        dest = params[target.name]
        if target.expert is not None:
            dest = dest[target.expert]
        if target.rows is not None:
            dest = dest[target.rows]
        dest.copy_(value)

    return write


def offloads_of(net: torch.nn.Module) -> list[ExpertOffload]:
    return [m.offload for m in net.modules() if isinstance(m, MXFP4Experts) and m.offload is not None]


@torch.no_grad()
def init_random_weights(net: DeepseekV4ForCausalLM, config: ModelConfig, seed: int,
                        shards: dict | None = None) -> None:
    """Deterministic random weights: N(0, 0.02) matrices, unit norms and mHC scales, zero biases,
    random hash-routing tables. Generated on the model's device, parameter by parameter (Engram
    tables by chunks, copied to where they live); a cut
    parameter (`shards`, `parallel/shard.py`) draws its full values and keeps its part, so every
    rank count gets the same model.
    The fp32 parameters whose checkpoint tensors are bf16 (`BF16_ON_DISK`) hold bf16 values, as when
    loaded. Quantized weights come in their formats: random e4m3 codes of N(0, 1) with power-of-two block
    scales 2^-7..2^-5; random packed e2m1 bytes with ue8m0 scales 2^-8..2^-6 (std ~0.01-0.05)."""
    device = net.lm_head.weight.device
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = []  # named_parameters' order, an offloaded layer's experts where its parameters were
    for prefix, module in net.named_modules():
        tensors += [(f"{prefix}.{n}", p) for n, p in module.named_parameters(recurse=False)]
        if isinstance(module, MXFP4Experts) and module.offload is not None:
            tensors += [(f"{prefix}.{n}", _ExpertRows(module.offload, n)) for n in EXPERT_TENSORS]
    tensors += list(net.named_buffers())
    # The MTP layer's tensors last: the main model's weights do not depend on whether it is built.
    tensors = [*(n for n in tensors if not n[0].startswith("mtp.")), *(n for n in tensors if n[0].startswith("mtp."))]
    for name, t in tensors:
        spec = shards.get(name) if shards else None
        shape = spec.full_shape if spec is not None else tuple(t.shape)
        if name.endswith(tuple(f"engram.{b}" for b in ENGRAM_TABLE_BUFFERS)):  # codes of N(0, 1), scales 2^-8..2^-6; by chunks (host memory)
            for part in t.split(max(1, _CHUNK_ELEMENTS // t.shape[1])):
                if t.dtype == torch.uint8:
                    value = torch.randint(119, 122, part.shape, generator=gen, device=device, dtype=torch.uint8)
                else:
                    value = torch.randn(part.shape, generator=gen, device=device).clamp_(-448, 448)
                part.copy_(value)
        elif t.dtype == torch.float8_e4m3fn:
            _put(t, spec, None, torch.randn(shape, generator=gen, device=device).clamp_(-448, 448))
        elif name.endswith("weight_scale_inv") and t.dtype == torch.float32:
            _put(t, spec, None, torch.exp2(torch.randint(-7, -4, shape, generator=gen, device=device).float()))
        elif t.dtype == torch.uint8:  # MXFP4 experts, slice by slice
            low, high = (119, 122) if name.endswith("_scale_inv") else (0, 256)
            for e in range(shape[0]):
                _put(t, spec, e, torch.randint(low, high, shape[1:], generator=gen, device=device, dtype=torch.uint8))
        elif name.endswith("tid2eid"):
            t.copy_(torch.randint(0, config.n_routed_experts, t.shape, generator=gen, device=device))
        elif name.endswith(("norm.weight", ".scale", "hc_scale")):
            t.fill_(1.0)
        elif name.endswith(("base", "hc_base", "sinks", "position_bias", "e_score_correction_bias")):
            t.zero_()
        else:  # slice by slice: a stacked expert tensor's fp32 temporary would not fit beside the model
            for e in (range(shape[0]) if len(shape) == 3 else [None]):
                values = torch.randn(shape[1:] if e is not None else shape, generator=gen, device=device,
                                     dtype=torch.float32).mul_(0.02)
                if any(f in name for f in BF16_ON_DISK):  # fp32 parameters of bf16 checkpoint tensors
                    values = values.bfloat16().float()
                _put(t, spec, e, values)


def _put(t, spec, expert: int | None, values: torch.Tensor) -> None:
    """Random values drawn at the full shape (of expert `expert`'s slice) into `t`: this rank's
    part of a cut parameter (`spec`), else all of it."""
    if spec is not None:
        spec.copy_part(t, expert, values)
    elif expert is None:
        t.copy_(values)
    elif isinstance(t, _ExpertRows):
        t.write(expert, values)
    else:
        t[expert].copy_(values)


_CHUNK_ELEMENTS = 1 << 26  # random values generated at once for a large host tensor


class _ExpertRows:
    """An offloaded experts tensor seen as its E rows in expert order (for random init)."""

    dtype = torch.uint8

    def __init__(self, offload: ExpertOffload, tensor: str):
        self.offload, self.tensor = offload, tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.offload.n_experts, *self.offload.dest(self.tensor, 0).shape)

    def write(self, expert: int, value: torch.Tensor) -> None:
        self.offload.dest(self.tensor, expert).copy_(value)


def save_pretrained(net: DeepseekV4ForCausalLM, config: ModelConfig, path: str | Path) -> None:
    """Write `config.json` and `model.safetensors` in transformers' naming (quantized modules as
    e4m3 `weight` + fp32 `weight_scale_inv`, packed experts + ue8m0 `*_scale_inv` bytes)."""
    if offloads_of(net):
        raise ValueError("save_pretrained of a model with offloaded experts: build it with cpu_offload_gb=0")
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config.to_hf_dict(), indent=2))
    tensors = {k: v.contiguous() for k, v in net.state_dict().items()}
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
