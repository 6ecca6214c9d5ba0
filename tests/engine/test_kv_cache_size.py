"""What fits in the KV cache: the budget against the bytes the pools really take, packed rows
against bf16 rows at Flash dimensions, and the start-up lines in vLLM's words."""

from __future__ import annotations

import re

import pytest
import torch

from v4serve import LLM
from v4serve.cache import CacheGeometry, PagedKVCache
from v4serve.cache.budget import solve_kv_budget
from v4serve.formats import CACHE_FORMATS
from v4serve.presets import preset_config

# Room for the fp8 rows' 64 bf16 rope channels plus a quantized block, and fp4 index keys.
PACKABLE = {"head_dim": 192, "qk_rope_head_dim": 64, "index_head_dim": 128}


def _allocated(cache: PagedKVCache) -> int:
    """Bytes of every distinct tensor the layer views hold (each counted once)."""
    tensors = {}
    for layer in range(len(cache.plan)):
        view = cache.view(layer)
        pools = [p.data for p in (view.window, view.compressed, view.index_keys) if p is not None]
        states = [t for s in (view.compressor_state, view.indexer_state) if s is not None for t in s.tensors()]
        for t in pools + states:
            tensors[t.data_ptr()] = t.numel() * t.element_size()
    return sum(tensors.values())


@pytest.mark.parametrize("kv_cache_dtype,dtype", [("bf16", torch.float32), ("bf16", torch.bfloat16),
                                                  ("auto", torch.bfloat16)])
def test_budget_is_what_the_pools_take(kv_cache_dtype, dtype):
    config = preset_config("tiny", PACKABLE)
    geometry = CacheGeometry.from_config(config, CACHE_FORMATS[kv_cache_dtype], packed=kv_cache_dtype == "auto")
    budget = solve_kv_budget(geometry, dtype, 12 * 2**20, 8, 128, 512)
    cache = PagedKVCache(geometry, budget.num_pages, 8, 512, 128, dtype, "cpu")
    assert _allocated(cache) == cache.nbytes == budget.total_bytes
    packed = [cache.view(i).window for i in range(len(cache.plan))]
    if kv_cache_dtype == "auto":  # bytes of the formats' packed rows
        assert all(p.packed and p.data.dtype == torch.uint8 for p in packed)
        assert packed[0].data.shape[1] == packed[0].row_format.row_bytes(192)
        index = cache.view(1).index_keys
        assert index.packed and index.data.shape[1] == index.row_format.row_bytes(128)
    else:
        assert all(not p.packed and p.data.dtype == dtype for p in packed)
    for p in packed:
        assert p.data.data_ptr() % 16 == 0


def test_auto_holds_at_least_1_9x_the_tokens_of_bf16_at_flash_dims():
    """Same kv_cache_memory, Flash geometry, up to 1M-token sequences: computed from the plans'
    budgets (no allocation)."""
    config = preset_config("deepseek-v4-flash")
    memory, seqs, pages_per_seq, step = 60 * 2**30, 64, 2**20 // config.page_size, 8192
    budgets = {}
    for name in ("bf16", "auto"):
        geometry = CacheGeometry.from_config(config, CACHE_FORMATS[name], packed=name == "auto")
        budgets[name] = solve_kv_budget(geometry, torch.bfloat16, memory, seqs, pages_per_seq, step)
    auto, bf16 = budgets["auto"], budgets["bf16"]
    assert auto.num_pages < seqs * pages_per_seq and bf16.num_pages < seqs * pages_per_seq  # not capped
    assert auto.num_tokens >= 1.9 * bf16.num_tokens, (auto.num_tokens, bf16.num_tokens)
    assert bf16.bytes_per_token == 6880  # 21 CSA layers x (1024/4 + 256/4) + 20 HCA x 1024/128
    per_layer = {"compressed rows": 21 / 4 + 20 / 128, "index keys": 21 / 4}
    fp8_row = auto.tier_bytes_per_token["compressed rows"] / per_layer["compressed rows"]
    assert 584 <= fp8_row <= 592 and auto.tier_bytes_per_token["index keys"] == 68 * per_layer["index keys"]
    assert auto.max_concurrency(32768) >= 1.9 * bf16.max_concurrency(32768)


def test_banner_says_what_fits():
    llm = LLM("tiny", device="cpu", max_model_len=1000, num_kv_pages=100, progress=False)
    lines = llm.engine.banner()
    text = "\n".join(lines)
    assert "KV cache dtype: bf16" in text
    assert f"KV cache size: {100 * 32} tokens" in lines
    # 1000 tokens take 32 pages of 32: 100 pages hold 3.125 such requests at once.
    assert "Maximum concurrency for 1000 tokens per request: 3.12x" in lines
    for tier in ("compressed rows", "index keys", "window ring", "compressor state"):
        assert re.search(rf"^\s+{tier}\s+[\d.]+ bytes/(token|sequence)", text, re.M), tier
    assert not any(line.startswith("Speculative decoding") for line in lines)


def test_banner_says_how_it_speculates():
    config = {"method": "mtp", "num_speculative_tokens": 2}
    shared = LLM("tiny", device="cpu", max_model_len=256, progress=False, speculative_config=config)
    assert ("Speculative decoding: mtp, 2 draft tokens a step; the drafts read the lm head"
            in shared.engine.banner())
    fp8 = LLM("tiny", device="cpu", max_model_len=256, progress=False,
              speculative_config={**config, "draft_head": "fp8"})
    head = fp8.engine.runner.model.draft_head
    mib = (head.weight.nbytes + head.weight_scale_inv.nbytes) / 2**20
    assert (f"Speculative decoding: mtp, 2 draft tokens a step; the drafts read an FP8 copy of the lm head, "
            f"{mib:.1f} MiB" in fp8.engine.banner())


def test_generate_prints_the_banner_to_stderr(capsys):
    from v4serve.cli import main

    assert main(["generate", "Hello", "--max-tokens", "2", "--device", "cpu", "--max-model-len", "256"]) == 0
    captured = capsys.readouterr()
    assert "KV cache size: " in captured.err and "Maximum concurrency for 256 tokens per request: " in captured.err
    assert "KV cache size" not in captured.out


GIB = 2**30


def _cuda_budget(monkeypatch, free, total, **args):
    """The runner's KV budget on a pretend CUDA device with `free` of `total` bytes free after the model."""
    from v4serve.engine import EngineArgs
    from v4serve.engine.model_runner import kv_budget

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, total))
    geometry = CacheGeometry.from_config(preset_config("tiny"), CACHE_FORMATS["bf16"], packed=False)
    return kv_budget(EngineArgs("tiny", **args), geometry, torch.bfloat16, torch.device("cuda"), 10**9, 512)


def _within_a_page(budget, memory) -> bool:
    return memory - budget.bytes_per_token * budget.page_size < budget.total_bytes <= memory


def test_gpu_memory_utilization_caps_what_the_engine_takes(monkeypatch):
    """vLLM's rule: u x total memory less what is in use; the same headroom (15% of the free memory)
    for activations as without it; u = 1 is the default's budget; kv_cache_memory wins."""
    free, total = 80 * GIB, 100 * GIB
    default = _cuda_budget(monkeypatch, free, total)
    assert _within_a_page(default, 0.85 * free)
    assert _cuda_budget(monkeypatch, free, total, gpu_memory_utilization=1.0).num_pages == default.num_pages
    half = _cuda_budget(monkeypatch, free, total, gpu_memory_utilization=0.5)  # 50 - 20 in use - 12 headroom
    assert _within_a_page(half, 18 * GIB)
    given = _cuda_budget(monkeypatch, free, total, gpu_memory_utilization=0.5, kv_cache_memory=GIB)
    assert _within_a_page(given, GIB)


def test_gpu_memory_utilization_too_small_names_itself(monkeypatch):
    with pytest.raises(ValueError, match=r"gpu_memory_utilization 0\.3: 30\.00 GiB of the GPU's 100\.00 GiB, "
                                         r"20\.00 GiB in use"):
        _cuda_budget(monkeypatch, 80 * GIB, 100 * GIB, gpu_memory_utilization=0.3)
    from v4serve.engine import EngineArgs

    for bad in (0, 1.5, -0.1, True, "0.9"):
        with pytest.raises(ValueError, match="gpu_memory_utilization must be a number in"):
            EngineArgs("tiny", gpu_memory_utilization=bad)


def test_auto_offload_places_experts_within_the_utilization(monkeypatch):
    from v4serve.engine import EngineArgs
    from v4serve.engine.model_runner import ModelRunner

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (80 * GIB, 100 * GIB))
    cuda = torch.device("cuda")
    assert ModelRunner._device_bytes(EngineArgs("tiny"), cuda) is None
    assert ModelRunner._device_bytes(EngineArgs("tiny", gpu_memory_utilization=0.9), cuda) == 70 * GIB
    assert ModelRunner._device_bytes(EngineArgs("tiny", gpu_memory_utilization=0.9), torch.device("cpu")) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_memory_utilization_on_the_device():
    """On the GPU: an engine built with u = 0.5 keeps its KV cache within u x total memory; the budget
    rule itself, read from the device (the tiny model's cache is capped by its sequences' pages
    long before), is below u x total less what is in use, and grows with u."""
    from v4serve.cache.budget import default_kv_memory

    llm = LLM("tiny", device="cuda", progress=False, cuda_graphs=False, gpu_memory_utilization=0.5)
    free, total = torch.cuda.mem_get_info()
    assert llm.engine.kv_budget.total_bytes <= 0.5 * total
    low, source = default_kv_memory(torch.device("cuda"), 0.3)
    assert source.startswith("gpu_memory_utilization 0.3") and low <= 0.3 * total - (total - free)
    assert low < default_kv_memory(torch.device("cuda"), 0.6)[0] <= default_kv_memory(torch.device("cuda"))[0]
