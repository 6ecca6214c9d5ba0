"""The model runner: the model, its layer plan, the KV cache it writes and the decode graphs.

Built once from `EngineArgs`: the model with its kernels bound (`model/kernels.py`) and its
projections fused, the layer plan for the cache's `kv_cache_dtype` (`v4serve/layer_plan.py`),
the memory budget solved from that plan (`cache/budget.py`), the cache, and the decode runner
(CUDA graphs). `prefill` and `decode` turn a step's tokens into logits; everything about requests
lives in the engine.

With `tensor_parallel_size` N > 1 the rank-0 runner starts ranks 1..N-1 (`parallel/launch.py`),
each building its own runner with `group`; the model is cut to the rank's part as it is built
(`parallel/shard.py`), every rank's KV cache holds the pages the smallest rank's memory allows,
and each `prefill` / `decode` is sent to the workers before rank 0 runs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time

import torch

from v4serve.cache import CacheGeometry, PagedKVCache, SequenceChunk
from v4serve.cache.kv_cache import prefix_caching_refusal
from v4serve.cache.state_checkpoints import checkpoint_bytes
from v4serve.cache.budget import (KVBudget, SnapshotSizing, budget_for_pages, default_kv_memory, memory_allowance,
                                  solve_kv_budget)
from v4serve.engine.args import EngineArgs, resolve_dtype
from v4serve.engine.decode_runner import DecodeRunner
from v4serve.formats import CacheFormat
from v4serve.engine.offload import kv_reserve_bytes, memory_map
from v4serve.layer_plan import ModelPlan, layer_plans, resolve_cache_format
from v4serve.model.expert_prefetch import link_layer_ahead_prefetch
from v4serve.model.loader import build_model, offloads_of, resolve_config
from v4serve.model.quantized_placement import module_bytes
from v4serve.parallel.group import Group
from v4serve.parallel.launch import Workers
from v4serve.parallel.shard import refuse_unsupported, shard_model

logger = logging.getLogger(__name__)


def kv_budget(args: EngineArgs, geometry: CacheGeometry, dtype: torch.dtype, device: torch.device,
              pages_per_seq: int, step_tokens: int | None = None, snapshots: SnapshotSizing | None = None,
              reserved: int = 0) -> KVBudget:
    """Pages: given, or solved from the byte budget (given, or free GPU memory: all of it or as
    `gpu_memory_utilization` allows, `cache/budget.default_kv_memory`), or full length.
    `step_tokens`: the cache's staging rows (default max_num_batched_tokens). `snapshots`: prefix
    caching's snapshot pool (None: prefix caching off). `reserved`: bytes of free GPU memory kept
    for other buffers of the cache's (speculative decoding's saved states)."""
    shape = (args.max_num_seqs, pages_per_seq, step_tokens or args.max_num_batched_tokens)
    if args.num_kv_pages is None and args.kv_cache_memory is not None:
        return solve_kv_budget(geometry, dtype, args.kv_cache_memory, *shape, snapshots=snapshots)
    if args.num_kv_pages is None and device.type == "cuda":
        memory, source = default_kv_memory(device, args.gpu_memory_utilization)
        return solve_kv_budget(geometry, dtype, memory - reserved, *shape, snapshots=snapshots, source=source)
    return budget_for_pages(geometry, dtype, args.num_kv_pages or args.max_num_seqs * pages_per_seq, *shape,
                            snapshots=snapshots)


def prefix_caching_off(args: EngineArgs, geometry: CacheGeometry) -> str | None:
    """Why prefix caching is off for these arguments and this cache (None: it is on)."""
    if args.enable_prefix_caching is False:
        return "prefix caching is off (enable_prefix_caching=False)"
    if args.speculative_config is not None:
        return ("prefix caching is off with speculative decoding (the MTP drafter needs the hidden "
                "states of every prompt token)")
    return prefix_caching_refusal(geometry)


def snapshot_sizing(args: EngineArgs) -> SnapshotSizing:
    return SnapshotSizing(args.prefix_snapshot_fraction, args.num_prefix_snapshots, args.max_num_seqs)


class ModelRunner:
    def __init__(self, args: EngineArgs, device: torch.device, dtype: torch.dtype, group: Group | None = None):
        self.device = device
        config = resolve_config(args.model, args.hf_overrides, args.quantization)
        refuse_unsupported(args.cpu_offload_gb, args.tensor_parallel_size)
        self.workers: Workers | None = None
        if args.tensor_parallel_size > 1 and group is None:  # rank 0: start the other ranks
            self.workers = Workers(args, device, dtype)
            group = self.workers.group
        self.group = group
        if config.v41 is not None:
            # DeepSeek-V4.1 defaults on any device: its reference's bf16 activations (its golden
            # outputs were made with them); resolve_cache_format gives it its native cache formats.
            dtype = resolve_dtype(args.dtype or torch.bfloat16, device)
        reserve = kv_reserve_bytes(args, config, device, dtype, args.kv_cache_dtype)
        self.cache_format: CacheFormat
        self.cache_format, self.cache_format_note = resolve_cache_format(config, args.kv_cache_dtype, device.type)
        if self.cache_format_note:
            logger.warning(self.cache_format_note)
        from v4serve.engine.spec_config import SpeculativeConfig, resolve_draft_head

        self.speculative = SpeculativeConfig.from_dict(args.speculative_config)
        if self.speculative is not None and args.tensor_parallel_size > 1:
            raise ValueError("speculative_config with tensor_parallel_size > 1 is not supported yet (the other ranks "
                             "do not replay the verification's rollback): future work")
        shard = None if group is None else (lambda net: shard_model(net, group, args.enable_expert_parallel))
        t0 = time.perf_counter()
        with self._guard("building the model"):
            self.model, config = build_model(args.model, device, dtype, args.hf_overrides,
                                             args.progress and (group is None or group.rank == 0),
                                             args.quantization, args.cpu_offload_gb, reserve,
                                             mtp=self.speculative is not None and self.speculative.method == "mtp",
                                             shard=shard, tensor_core_decode=args.tensor_core_decode,
                                             draft_head=resolve_draft_head(self.speculative, device),
                                             device_bytes=self._device_bytes(args, device))
        self.model.fuse_projections()
        self.model.bind_kernels(args.kernels)
        for offload in offloads_of(self.model):  # before the decode graphs capture the pass schedule
            offload.overlap = offload.overlap and args.offload_overlap
        if args.offload_prefetch:
            link_layer_ahead_prefetch(self.model)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.load_seconds = time.perf_counter() - t0  # weights read or generated, placed, fused
        self.config = config
        self.max_model_len = args.max_model_len or min(config.max_position_embeddings, 8192)
        if self.max_model_len > config.max_position_embeddings:
            raise ValueError(
                f"max_model_len ({self.max_model_len}) exceeds the model's max_position_embeddings "
                f"({config.max_position_embeddings})"
            )
        self.plan: ModelPlan = layer_plans(config, self.cache_format)
        geometry = CacheGeometry.from_plan(self.plan, config.page_size)
        pages_per_seq = -(-self.max_model_len // config.page_size)
        self.prefix_caching_note = prefix_caching_off(args, geometry)
        if self.prefix_caching_note and args.enable_prefix_caching is not False:
            # asked for explicitly: a warning; by default: a line of the log
            (logger.warning if args.enable_prefix_caching else logger.info)(self.prefix_caching_note)
        snapshots = None if self.prefix_caching_note else snapshot_sizing(args)
        self.kv_budget = kv_budget(args, geometry, dtype, device, pages_per_seq, self.max_step_tokens(args), snapshots,
                                   reserved=self.speculative_bytes(args, geometry, dtype))
        if self.workers is not None:
            self.workers.connect()
        if group is not None:  # every rank holds the same pages and snapshot slots: as many as the smallest allows
            with self._guard("sizing the KV cache"):
                pages = group.all_reduce_min(self.kv_budget.num_pages)
                slots = group.all_reduce_min(self.kv_budget.snapshot_slots)
            if (pages, slots) != (self.kv_budget.num_pages, self.kv_budget.snapshot_slots):
                fixed = dataclasses.replace(snapshots, count=slots) if snapshots is not None else None
                self.kv_budget = budget_for_pages(geometry, dtype, pages, args.max_num_seqs, pages_per_seq,
                                                  self.max_step_tokens(args), fixed)
        if self.kv_budget.num_pages < pages_per_seq:  # a long request would preempt itself forever
            raise ValueError(
                f"the KV cache holds {self.kv_budget.num_pages} pages ({self.kv_budget.num_tokens} tokens), fewer "
                f"than one sequence of max_model_len {self.max_model_len} needs ({pages_per_seq} pages): give it "
                f"more memory (kv_cache_memory / num_kv_pages) or lower max_model_len"
            )
        self.cache = PagedKVCache(
            geometry,
            num_pages=self.kv_budget.num_pages,
            max_seqs=args.max_num_seqs,
            max_step_tokens=self.max_step_tokens(args),
            max_pages_per_seq=pages_per_seq,
            dtype=dtype,
            device=device,
            # verify steps write k rows past a sequence's kept tokens (cache/state_checkpoints.py)
            ring_extra=self.speculative.num_speculative_tokens if self.speculative else 0,
        )
        if snapshots is not None:
            page = self.cache.page_size
            refused = self.cache.enable_prefix_caching(self.kv_budget.snapshot_slots,
                                                       chunk_grid=max(page, args.max_num_batched_tokens // page * page))
            if refused:  # prefix_caching_off checked the same geometry
                raise AssertionError(refused)
        t0 = time.perf_counter()
        # Offloaded experts are planned and fetched on the device (model/quantized_offload.py), V4.1's
        # selection runs on the device and its Engram rows are read from pinned host memory by a kernel
        # (ops/engram_lookup.py): captured like the rest (tests/engine/test_v41_decode_capture.py).
        self.graphs_wanted = device.type == "cuda" and args.cuda_graphs and not args.enforce_eager
        self.graph_sizes = None if args.cuda_graph_sizes is None else tuple(args.cuda_graph_sizes)
        self.decode_runner = DecodeRunner(
            self.model, self.cache, args.max_num_seqs,
            # Speculative decoding captures its own steps (engine/verify_runner.py), not these.
            use_cuda_graphs=self.graphs_wanted and self.speculative is None, graph_sizes=self.graph_sizes,
        )
        self.capture_seconds = time.perf_counter() - t0  # decode graphs (and the kernels they compile)
        if self.workers is not None:
            self.workers.record(self.cache)

    @staticmethod
    def _device_bytes(args: EngineArgs, device: torch.device) -> int | None:
        """What the model may take of the device when `cpu_offload_gb="auto"` places experts: None
        (its free memory) unless `gpu_memory_utilization` caps it."""
        if args.gpu_memory_utilization is None or device.type != "cuda":
            return None
        return memory_allowance(device, args.gpu_memory_utilization)

    def _guard(self, what: str):
        return self.workers.guard(what) if self.workers is not None else contextlib.nullcontext()

    def banner(self) -> list[str]:
        """The start-up lines: the KV cache dtype, what fits (vLLM's words), every tier's bytes, prefix
        caching (on, or why off), speculative decoding (when on), the memory map of the weights."""
        note = f" ({self.cache_format_note})" if self.cache_format_note else ""
        b = self.kv_budget
        prefix = (f"Prefix caching: off ({self.prefix_caching_note})" if self.prefix_caching_note else
                  f"Prefix caching: on ({b.snapshot_slots} snapshot slots of {b.snapshot_slot_bytes} bytes, "
                  f"{b.snapshot_bytes / 2**20:.1f} MiB)")
        return [f"KV cache dtype: {self.cache_format.name}{note}", *b.describe(self.max_model_len), prefix,
                *self._speculative_lines(), *memory_map(self.model, b.total_bytes, self.cache.device)]

    def _speculative_lines(self) -> list[str]:
        spec = self.speculative
        if spec is None:
            return []
        head = self.model.draft_head
        head_note = "the lm head" if head is None else f"an FP8 copy of the lm head, {module_bytes(head) / 2**20:.1f} MiB"
        return [f"Speculative decoding: {spec.method}, {spec.num_speculative_tokens} draft tokens a step; "
                f"the drafts read {head_note}"]

    def speculative_bytes(self, args: EngineArgs, geometry: CacheGeometry, dtype: torch.dtype) -> int:
        """Bytes speculative decoding adds beside the KV budget: the verify steps' saved compressor
        states (cache/state_checkpoints.py) and k more rows in every slot's window rings."""
        if self.speculative is None:
            return 0
        k = self.speculative.num_speculative_tokens
        compressors = [c for g in geometry.layers for c in (g.compressor, g.indexer) if c is not None]
        per_slot = sum(c.state_bytes for c in compressors)
        window_row = sum(rows["window"] for rows in geometry.row_bytes(torch.empty((), dtype=dtype).element_size()))
        return (checkpoint_bytes(per_slot, len(compressors), k + 1, args.max_num_seqs)
                + k * (args.max_num_seqs + 1) * window_row)

    def max_step_tokens(self, args: EngineArgs) -> int:
        """Tokens one step may hold: the batch budget, plus k drafts per sequence when speculating."""
        extra = self.speculative.num_speculative_tokens * args.max_num_seqs if self.speculative else 0
        return args.max_num_batched_tokens + extra

    def prefill_with_streams(self, chunks: list[SequenceChunk], token_ids: list[int], logits_rows: list[int]
                             ) -> tuple[torch.Tensor, torch.Tensor]:
        """`prefill`, plus the final residual streams of every token [T, hc, D] (the MTP layer's input)."""
        return self.model.forward_with_streams(self.cache.build_batch(chunks, token_ids, logits_rows), self.cache)

    def prefill(self, chunks: list[SequenceChunk], token_ids: list[int], logits_rows: list[int]) -> torch.Tensor:
        """Logits [len(logits_rows), vocab] of a step of chunks (prefill or mixed)."""
        if self.workers is None:
            return self.model(self.cache.build_batch(chunks, token_ids, logits_rows), self.cache)
        self.workers.send("prefill", chunks, token_ids, logits_rows)
        with self.workers.guard("running a prefill step"):
            return self.model(self.cache.build_batch(chunks, token_ids, logits_rows), self.cache)

    def decode(self, token_ids: list[int] | torch.Tensor, positions: list[int], slots: list[int]) -> torch.Tensor:
        """Logits [n, vocab] of one token per sequence (graph-replayed on CUDA)."""
        if self.workers is None:
            return self.decode_runner.run(token_ids, positions, slots)
        on_device = isinstance(token_ids, torch.Tensor)
        self.workers.send("decode", None if on_device else list(token_ids), list(positions), list(slots))
        with self.workers.guard("running a decode step"):
            if on_device:  # a continuation's sampled tokens go to the workers device to device
                token_ids = self.group.broadcast(token_ids.to(torch.int64).contiguous())
            return self.decode_runner.run(token_ids, positions, slots)

    def close(self) -> None:
        """Stop the other ranks (also done when the runner is garbage-collected or at exit)."""
        if self.workers is not None:
            self.workers.close()
