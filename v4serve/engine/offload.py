"""Engine side of weight placement: the `--cpu-offload-gb` / `--quantization` flags, the KV
budget that `cpu_offload_gb="auto"` keeps free, and the start-up memory map.

The mechanism (which experts are resident, device slots, fetch, eviction) is
`model/quantized_offload.py`; the placement arithmetic is `model/quantized_placement.py`.
"""

from __future__ import annotations

import argparse
import logging

import torch

from v4serve.cache import CacheGeometry
from v4serve.cache.budget import budget_for_pages

logger = logging.getLogger(__name__)


def parse_cpu_offload_gb(text: str) -> float | str:
    """`--cpu-offload-gb 40` (GiB of routed experts in pinned host memory) or `auto`."""
    if text == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpu-offload-gb must be a number of GiB or 'auto', got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"--cpu-offload-gb must be >= 0, got {text!r}")
    return value


def kv_reserve_bytes(args, config, device: torch.device, dtype: torch.dtype, kv_cache_dtype: str | None = None) -> int:
    """Bytes `auto` offload leaves free for the KV cache: `kv_cache_memory` when given, else the
    pages of max_num_seqs full-length sequences in the cache's formats (and the prefix snapshots)."""
    if args.cpu_offload_gb != "auto" or device.type != "cuda":
        return 0
    if args.kv_cache_memory is not None:
        return int(args.kv_cache_memory)
    from v4serve.layer_plan import layer_plans, resolve_cache_format

    max_len = args.max_model_len or min(config.max_position_embeddings, 8192)
    pages = -(-max_len // config.page_size)
    geometry = CacheGeometry.from_plan(layer_plans(config, resolve_cache_format(config, kv_cache_dtype, "cuda")[0]),
                                       config.page_size)
    from v4serve.engine.model_runner import prefix_caching_off, snapshot_sizing

    snapshots = None if prefix_caching_off(args, geometry) else snapshot_sizing(args)
    budget = budget_for_pages(geometry, dtype, args.num_kv_pages or args.max_num_seqs * pages,
                              args.max_num_seqs, pages, args.max_num_batched_tokens, snapshots)
    return budget.total_bytes


def memory_map(model: torch.nn.Module, kv_total_bytes: int) -> list[str]:
    """Start-up lines (also logged at INFO): weights on the device (dense, resident experts, expert
    slots), weights in host memory, KV cache."""
    from v4serve.model.loader import offloads_of

    offloads = offloads_of(model)
    device = model.lm_head.weight.device
    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.device.type != "meta"]
    params = sum(t.numel() * t.element_size() for t in tensors if t.device == device)
    tables = sum(t.numel() * t.element_size() for t in tensors if t.device != device)  # V4.1's Engram tables
    resident = sum(o.device_bytes()[0] for o in offloads)
    slots = sum(o.device_bytes()[1] for o in offloads)
    host = sum(o.host_bytes() for o in offloads)
    n_host = sum(len(o.host_experts) for o in offloads)
    gib = 2**30
    lines = ["Memory map:",
             f"  weights on the device   {(params + resident) / gib:9.2f} GiB"
             + (f" (of which resident offload-layer experts {resident / gib:.2f} GiB)" if offloads else ""),
             f"  weights in host memory  {host / gib:9.2f} GiB ({n_host} routed experts in {len(offloads)} layers, "
             f"pinned)" if offloads else "  weights in host memory       0.00 GiB",
             *([f"  Engram tables in host memory {tables / gib:9.2f} GiB"] if tables else []),
             f"  expert cache (staging)  {slots / gib:9.2f} GiB"
             + (f" ({offloads[0].n_slots} slots per offloaded layer)" if offloads else ""),
             f"  KV cache                {kv_total_bytes / gib:9.2f} GiB"]
    for line in lines:
        logger.info(line)
    return lines
