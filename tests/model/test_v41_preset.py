"""The `deepseek-v4.1-flash` preset: its depth cut, its KV bytes per token against the pools' real
bytes and the row formats (architecture reference section 9: 528 / 288 / 68 B rows), and a tiny
build in the official weight formats running on the CPU."""

from __future__ import annotations

import pytest
import torch

from v4serve.bench.kv_bytes import kv_bytes_lines
from v4serve.cache import CacheGeometry, PagedKVCache
from v4serve.cache.budget import budget_for_pages
from v4serve.formats import CACHE_FORMATS
from v4serve.layer_plan import IndexerMode, layer_plans
from v4serve.presets import preset_config

# Small everywhere but the rows: head_dim 512 / index_head_dim 128 keep the native row formats' sizes.
TINY = {"num_hidden_layers": 5, "hidden_size": 256, "num_attention_heads": 2, "q_lora_rank": 64, "o_lora_rank": 64,
        "o_groups": 2, "n_routed_experts": 8, "moe_intermediate_size": 64, "index_n_heads": 2, "index_topk": 16,
        "vocab_size": 1024, "engram_vocab_size": 61, "engram_compressed_vocab_size": 512, "engram_n_heads": 2,
        "engram_head_dim": 64, "max_position_embeddings": 4096, "sliding_window": 128}


def test_a_depth_cut_keeps_the_roles_inside_it():
    full = preset_config("deepseek-v4.1-flash")
    assert full.num_hidden_layers == 40 and full.v41.kv_source_layer_ids == (2, 8, 14, 20)
    cut = preset_config("deepseek-v4.1-flash", {"num_hidden_layers": 12})
    v = cut.v41
    assert (v.kv_source_layer_ids, v.index_source_layer_ids, v.engram_layer_ids) == ((2, 8), (2, 8), (1,))
    assert v.candidate_source_layer_id is None
    assert preset_config("deepseek-v4.1-flash", {"num_hidden_layers": 21}).v41.candidate_source_layer_id == 20
    plan = layer_plans(cut, CACHE_FORMATS["auto"])
    assert [p.engram_table for p in plan] == [None, 0] + [None] * 10
    assert all(p.lagged_hc and not p.q_head_rms for p in plan) and not plan.hc_head and plan.fp32_head


def _pool_bytes_per_token(cache: PagedKVCache, tier: str) -> float:
    """Bytes per token of history of a paged tier, from the allocated tensors (less the scratch row)."""
    total = 0.0
    for layer, p in enumerate(cache.plan):
        pool = getattr(cache.view(layer), tier)
        if p.owns_pools and pool is not None:
            rows = pool.data.shape[0] - 1
            total += (pool.data.nbytes - pool.data.nbytes // pool.data.shape[0]) / (rows * p.ratio)
    return total


def test_kv_bytes_per_token_are_the_pools_real_bytes():
    config = preset_config("deepseek-v4.1-flash", TINY)
    geometry = CacheGeometry.from_config(config, CACHE_FORMATS["auto"])
    cache = PagedKVCache(geometry, num_pages=4, max_seqs=2, max_step_tokens=64, max_pages_per_seq=2,
                         dtype=torch.bfloat16, device="cpu")
    budget = budget_for_pages(geometry, torch.bfloat16, 4, 2, 2, 64)
    compressed, index = _pool_bytes_per_token(cache, "compressed"), _pool_bytes_per_token(cache, "index_keys")
    sources = [i for i in range(5) if i in config.v41.kv_source_layer_ids]
    assert sources == [2] and config.v41.compress_ratios[2] == 2
    assert (compressed, index) == (288 / 2, 68 / 2)  # fp4_e4m3_b16 rows of 512, fp4_e8m0_b32 keys of 128
    assert budget.tier_bytes_per_token == {"compressed rows": compressed, "index keys": index}
    for layer, p in enumerate(cache.plan):
        view = cache.view(layer)
        assert view.window.data.shape[1] == 528  # fp8_e8m0_b32 rows of 512 in every layer
        assert (view.compressed is not None) == bool(p.ratio)
        assert p.owns_pools == (layer in (0, 1, 2)) and (p.indexer is IndexerMode.FULL) == (layer == 2)
    assert budget.tier_bytes_per_sequence["window ring"] == 5 * 128 * 528
    lines, agree = kv_bytes_lines(cache, budget)
    assert agree and lines[-1].startswith("KV bytes per token: pools 178.00, formats 178.00, budget 178.00")


def test_flash_kv_bytes_per_token_are_the_reference_figure():
    """Architecture reference section 10.2: 3 x 356 / 2 + 356 = 890 B per token at 40 layers."""
    geometry = CacheGeometry.from_config(preset_config("deepseek-v4.1-flash"), CACHE_FORMATS["auto"])
    cache = PagedKVCache(geometry, num_pages=2, max_seqs=1, max_step_tokens=16, max_pages_per_seq=2,
                         dtype=torch.bfloat16, device="cpu")
    assert _pool_bytes_per_token(cache, "compressed") + _pool_bytes_per_token(cache, "index_keys") == 890
    lines, agree = kv_bytes_lines(cache, budget_for_pages(geometry, torch.bfloat16, 2, 1, 2, 16))
    assert agree and "(40 layers: 0, 1, 2," in lines[1]


def test_tiny_preset_runs_in_the_official_formats():
    from v4serve import LLM, SamplingParams
    from v4serve.model.quantized import FP8Linear, MXFP4Experts

    # window, Engram + window, kv source (ratio 2)
    llm = LLM("deepseek-v4.1-flash", device="cpu", hf_overrides={**TINY, "num_hidden_layers": 3}, max_model_len=256,
              progress=False)
    net = llm.engine.runner.model
    layers = net.model.layers
    q_a, experts, engram = layers[2].self_attn.q_a_proj, layers[2].mlp.experts, layers[1].engram
    assert isinstance(q_a, FP8Linear) and q_a.block == (32, 32) and q_a.act_block == 32
    assert isinstance(experts, MXFP4Experts) and experts.weight_before_down
    assert isinstance(engram.wkv, FP8Linear) and engram.table.dtype == torch.float8_e4m3fn
    assert engram.table_scale.shape == (engram.table.shape[0], 2) and engram.table.device.type == "cpu"
    assert 119 <= int(engram.table_scale.min()) and int(engram.table_scale.max()) <= 121  # scales 2^-8..2^-6
    assert [layer.engram is not None for layer in layers] == [False, True, False]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=0)
    a, b = (out.outputs[0] for out in llm.generate(prompt_token_ids=[list(range(3, 30))] * 2, sampling_params=params))
    assert a.token_ids == b.token_ids and len(a.token_ids) == 3  # each sequence keeps its own token history
    assert all(torch.isfinite(torch.tensor(next(iter(p.values())).logprob)) for p in a.logprobs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernels", ["auto", "torch"])  # V4.1's first GPU run: which side fails, if one does
def test_flash_preset_on_the_gpu(kernels):
    """Full V4.1-Flash layers (depth 4: window, Engram + window, kv source, reuse) in the official
    formats on the device, Engram tables (1M buckets) in host memory; greedy decode twice equal."""
    import gc

    from v4serve import LLM, SamplingParams

    llm = LLM("deepseek-v4.1-flash", hf_overrides={"num_hidden_layers": 4, "engram_vocab_size": 1 << 20},
              max_model_len=4096, max_num_seqs=4, num_kv_pages=256, kernels=kernels, progress=False)
    lines, agree = kv_bytes_lines(llm.engine.cache, llm.engine.kv_budget)
    assert agree, lines
    assert llm.engine.kv_budget.bytes_per_token == (288 + 68) / 2
    assert llm.engine.runner.model.model.layers[1].engram.table.device.type == "cpu"
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, logprobs=0)
    prompts = [list(range(10, 10 + n)) for n in (300, 17, 1000)]
    a = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    b = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    for x, y in zip(a, b):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids and len(x.outputs[0].token_ids) == 32
        assert all(torch.isfinite(torch.tensor(next(iter(p.values())).logprob)) for p in x.outputs[0].logprobs)
    del llm, a, b
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_flash_preset_decodes_in_cuda_graphs_as_eagerly():
    """The V4.1-Flash preset cut to 4 layers (window, Engram + window, kv source, reuse) decodes in
    CUDA graphs (Engram rows read from pinned host memory by the lookup kernel, selection and
    attention over the packed rows on the device) and gives the eager run's tokens and logprobs:
    4 sequences at max_num_seqs 4, so both runs decode every step at batch 4 (the same kernels)."""
    import gc

    from v4serve import LLM, SamplingParams

    prompts = [list(range(10, 10 + n)) for n in (300, 17, 1000, 129)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0)
    runs = {}
    for graphs in (True, False):
        llm = LLM("deepseek-v4.1-flash", hf_overrides={"num_hidden_layers": 4, "engram_vocab_size": 1 << 18},
                  max_model_len=4096, max_num_seqs=4, num_kv_pages=256, cuda_graphs=graphs, progress=False)
        assert llm.engine.decode_runner.uses_cuda_graphs == graphs
        engram = llm.engine.runner.model.model.layers[1].engram
        assert engram.table.device.type == "cpu" and engram.table.is_pinned()
        runs[graphs] = llm.generate(prompt_token_ids=prompts, sampling_params=params)
        del llm, engram
        gc.collect()
        torch.cuda.empty_cache()
    for a, b in zip(runs[True], runs[False]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids and len(a.outputs[0].token_ids) == 24
        la = [next(iter(p.values())).logprob for p in a.outputs[0].logprobs]
        lb = [next(iter(p.values())).logprob for p in b.outputs[0].logprobs]
        assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-3
