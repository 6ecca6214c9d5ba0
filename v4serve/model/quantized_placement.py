"""Where the routed experts live when they do not all fit the GPU (`cpu_offload_gb`, vLLM's name).

    cpu_offload_gb = X (GiB): ceil(X * 2^30 / expert_bytes) experts go to pinned host memory,
        spread evenly over the MXFP4 layers (the highest expert ids of each layer);
    cpu_offload_gb = "auto": nothing on a CPU device; on a GPU, every weight stays on the GPU if
        weights + reserve (the KV budget asked for) + a margin fit its free memory, else just enough
        experts are offloaded (their slots counted) for it to fit.

Every offloaded layer gets `n_slots` device slots (default 2 * num_experts_per_tok, at most the
number it offloads) for the experts a step fetches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from v4serve.model.quantized import MXFP4Experts

GIB = 2**30
AUTO_MARGIN_BYTES = 2 * GIB  # activations, CUDA graphs, allocator slack


@dataclass
class Placement:
    host_experts: dict[str, list[int]] = field(default_factory=dict)  # experts module -> offloaded ids
    n_slots: int = 0

    def __bool__(self) -> bool:
        return any(self.host_experts.values())


def module_bytes(net: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in list(net.parameters()) + list(net.buffers()))


def plan_placement(net: torch.nn.Module, config, cpu_offload_gb: float | str, device: torch.device,
                   reserve_bytes: int = 0, n_slots: int | None = None, free_bytes: int | None = None) -> Placement:
    """The placement for a built (meta) model; `free_bytes` defaults to the GPU's free memory."""
    if cpu_offload_gb in (0, None):
        return Placement()
    experts = [(name, m) for name, m in net.named_modules() if isinstance(m, MXFP4Experts)]
    if not experts:
        if cpu_offload_gb == "auto":
            return Placement()
        raise ValueError("cpu_offload_gb offloads MXFP4 routed experts; this model has none "
                         "(use a checkpoint or preset with expert_dtype fp4)")
    per_expert = experts[0][1].expert_bytes()
    n_experts = config.n_routed_experts
    slots = n_slots or 2 * config.num_experts_per_tok
    if cpu_offload_gb == "auto":
        if device.type != "cuda":
            return Placement()
        free = free_bytes if free_bytes is not None else torch.cuda.mem_get_info(device)[0]
        deficit = module_bytes(net) + reserve_bytes + AUTO_MARGIN_BYTES - free
        if deficit <= 0:
            return Placement()
        total = math.ceil((deficit + len(experts) * slots * per_expert) / per_expert)
    else:
        if not isinstance(cpu_offload_gb, (int, float)) or cpu_offload_gb < 0:
            raise ValueError(f"cpu_offload_gb must be a number of GiB >= 0 or 'auto', got {cpu_offload_gb!r}")
        total = math.ceil(cpu_offload_gb * GIB / per_expert)
    total = min(total, len(experts) * n_experts)
    placement = Placement(n_slots=slots)
    base, extra = divmod(total, len(experts))
    for i, (name, _) in enumerate(experts):
        h = base + (1 if i < extra else 0)
        placement.host_experts[name] = list(range(n_experts - h, n_experts))
    if total == len(experts) * n_experts and cpu_offload_gb == "auto":
        raise ValueError("the model does not fit even with every routed expert in host memory; "
                         "lower the KV budget (kv_cache_memory / max_model_len)")
    return placement
