"""`EngineArgs`: what an engine is built from (vLLM's names), and how the defaults resolve."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from v4serve.cache.budget import PREFIX_SNAPSHOT_FRACTION

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


@dataclass(frozen=True)
class EngineArgs:
    model: str
    device: str | None = None  # default: cuda when present
    dtype: str | torch.dtype | None = None  # default: bfloat16 on cuda, float32 on cpu
    # "auto": the model's native packed formats (fp8 KV rows, fp4 index keys; default on cuda);
    # "bf16": unquantized rows in the model's dtype, what transformers computes (default on cpu).
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None  # default: min(max_position_embeddings, 8192)
    max_num_seqs: int = 8
    max_num_batched_tokens: int = 512
    num_kv_pages: int | None = None  # default: from kv_cache_memory, else free GPU memory, else full length
    kv_cache_memory: int | None = None  # bytes for the KV cache (all tiers); solved into pages
    # Share of the GPU's total memory this engine may use: weights, KV cache, activations (vLLM's
    # name). None: all of its free memory. kv_cache_memory / num_kv_pages, when given, size the cache.
    gpu_memory_utilization: float | None = None
    hf_overrides: dict[str, Any] | None = None
    kernels: str = "auto"  # "auto": Triton kernels on CUDA, torch references on CPU; or "torch" / "triton"
    cuda_graphs: bool = True  # decode steps replay captured CUDA graphs (on CUDA)
    enforce_eager: bool = False  # vLLM's name: no CUDA graphs, every step eager (cuda_graphs=False)
    cuda_graph_sizes: tuple[int, ...] | None = None  # decode batch sizes captured (default 1, 2, 4, ..., max_num_seqs)
    # Reuse the KV pages of a cached prompt prefix (`cache/prefix_cache.py`; bit-exact hits, prefill
    # chunks end on page boundaries). None = on where supported; off, with a log line, with
    # speculative decoding and DeepSeek-V4.1 (True there: a warning).
    enable_prefix_caching: bool | None = None  # None: on where supported (vLLM's default)
    prefix_snapshot_fraction: float = PREFIX_SNAPSHOT_FRACTION  # share of the KV cache for prefix snapshots (the states where a cached prefix can end)
    num_prefix_snapshots: int | None = None  # prefix snapshot slots (None: from prefix_snapshot_fraction, at least max_num_seqs)
    overlap_decode: bool = True  # launch decode step N+1 before reading step N's tokens
    seed: int = 0
    # Speculative decoding, as vLLM spells it: {"method": "mtp", "num_speculative_tokens": k} (the
    # checkpoint's MTP layer drafts k tokens, the model verifies them in one step); also "draft_head":
    # "auto" (an FP8 copy of the lm head for the drafts on CUDA) | "fp8" | "shared" (engine/spec_config.py).
    speculative_config: dict[str, Any] | None = None
    tensor_parallel_size: int = 1  # processes (GPUs), one per rank, started by v4serve; the model is split across them
    enable_expert_parallel: bool = False  # with tensor_parallel_size > 1: split routed experts by expert, not by channel
    progress: bool = True
    quantization: str | None = None  # override config.json: "fp8", "fp8-reference", "none" (config.QUANTIZATION_CHOICES)
    cpu_offload_gb: float | str = 0  # GiB of routed experts in pinned host memory, or "auto" (engine/offload.py)
    offload_prefetch: bool = False  # offloaded layers: each layer guesses the next one's picks with its router and prefetches them (model/expert_prefetch.py)
    offload_overlap: bool = True  # offloaded layers on CUDA: resident experts computed in their own pass while the missing ones are fetched (off: one pass fewer)
    tensor_core_decode: bool | None = None  # MXFP4 experts at decode on tensor cores (where every scale byte <= 128) or the GEMV (None: ops/mxfp4_moe_decode.TENSOR_CORE_DECODE, production's rule)

    def __post_init__(self):
        u = self.gpu_memory_utilization
        if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1):
            raise ValueError(f"gpu_memory_utilization must be a number in (0, 1], got {u!r}")


def resolve_device(device: str | None) -> torch.device:
    return torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if dtype is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(_DTYPES)}")
    return _DTYPES[dtype]
