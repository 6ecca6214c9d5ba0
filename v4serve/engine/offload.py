"""Engine side of weight placement: parsing `--cpu-offload-gb`, the KV budget that
`cpu_offload_gb="auto"` keeps free, the start-up memory map, and placement by
measured use (`calibrate_placement`: a calibration run, then the most used experts resident).

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


def memory_summary(model: torch.nn.Module, kv_total_bytes: int, device: torch.device) -> dict[str, float]:
    """GiB: weights on `device` (all, and of it the offload layers' resident experts and their
    expert slots), weights in pinned host memory, V4.1's Engram tables in host memory, the KV cache;
    and the counts of host experts."""
    from v4serve.model.loader import offloads_of

    offloads = offloads_of(model)
    # Each storage once: a fused projection's weight is one buffer whose rows are its members'
    # weights (model/fusion.py), so parameters and buffers share storage.
    storages = {}
    for t in list(model.parameters()) + list(model.buffers()):
        if t.device.type != "meta":
            storages[(t.device, t.untyped_storage().data_ptr())] = t
    # By device type: `device` may be given as "cuda" and the tensors live on "cuda:0".
    params = sum(t.untyped_storage().nbytes() for t in storages.values() if t.device.type == device.type)
    tables = sum(t.untyped_storage().nbytes() for t in storages.values() if t.device.type != device.type)  # V4.1's Engram tables
    resident = sum(o.device_bytes()[0] for o in offloads)
    slots = sum(o.device_bytes()[1] for o in offloads)
    gib = 2**30
    return {"device_weights": round((params + resident + slots) / gib, 2), "resident_offload_experts": round(resident / gib, 2),
            "expert_slots": round(slots / gib, 2), "host_weights": round(sum(o.host_bytes() for o in offloads) / gib, 2),
            "host_experts": sum(len(o.host_row) for o in offloads), "offloaded_layers": len(offloads),
            "slots_per_layer": offloads[0].n_slots if offloads else 0, "kv_cache": round(kv_total_bytes / gib, 2),
            "engram_tables": round(tables / gib, 2)}


def memory_map(model: torch.nn.Module, kv_total_bytes: int, device: torch.device) -> list[str]:
    """Start-up lines (also logged at INFO): weights on the device (dense, resident experts, expert
    slots), weights in host memory, KV cache."""
    m = memory_summary(model, kv_total_bytes, device)
    offloaded = m["offloaded_layers"] > 0
    lines = ["Memory map:",
             f"  weights on the device   {m['device_weights'] - m['expert_slots']:9.2f} GiB"
             + (f" (of which resident offload-layer experts {m['resident_offload_experts']:.2f} GiB)" if offloaded else ""),
             f"  weights in host memory  {m['host_weights']:9.2f} GiB ({m['host_experts']} routed experts in "
             f"{m['offloaded_layers']} layers, pinned)" if offloaded else "  weights in host memory       0.00 GiB",
             *([f"  Engram tables in host memory {m['engram_tables']:9.2f} GiB"] if m["engram_tables"] else []),
             f"  expert cache (staging)  {m['expert_slots']:9.2f} GiB"
             + (f" ({m['slots_per_layer']} slots per offloaded layer)" if offloaded else ""),
             f"  KV cache                {m['kv_cache']:9.2f} GiB"]
    for line in lines:
        logger.info(line)
    return lines


def reset_use_counts(engine) -> None:
    """Zero the picks counted per (offloaded layer, expert)."""
    from v4serve.model.loader import offloads_of

    for o in offloads_of(engine.model):
        o.counts.zero_()


def calibrate_placement(engine, prompt_tokens: int, seed: int = 0, requests: int = 8, output_tokens: int = 32) -> dict:
    """Placement by measured use: run `requests` random prompts of prompt_tokens / requests tokens
    (each generating `output_tokens`), count every pick per (offloaded layer, expert), then make
    each layer's most used experts resident (`ExpertOffload.place_by_counts`). Returns the counts'
    skew (`router_skew.use_summary`) and the experts moved."""
    from v4serve.engine.sampling_params import SamplingParams
    from v4serve.model.loader import offloads_of
    from v4serve.model.router_skew import use_summary

    offloads = offloads_of(engine.model)
    reset_use_counts(engine)
    gen = torch.Generator().manual_seed(10_000 + seed)
    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    length = max(1, prompt_tokens // requests)
    for i in range(requests):
        prompt = torch.randint(10, min(1000, engine.config.vocab_size), (length,), generator=gen).tolist()
        engine.add_request(f"calibrate{seed}-{i}", prompt, params)
    while engine.has_unfinished():
        engine.step()
    counts = torch.stack([o.counts for o in offloads]) if offloads else torch.zeros(1, 1)
    swaps = sum(o.place_by_counts() for o in offloads)
    return {"tokens": requests * (length + output_tokens), "experts_moved": swaps, "use": use_summary(counts)}
