"""The CUDA-graph decode runner gives what eager decoding gives (GPU only)."""

from __future__ import annotations

import pytest
import torch

from v4serve import LLM, SamplingParams

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kernels", ["auto", "torch"])  # the Triton kernels, and the torch references captured
@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "auto"])  # "auto": packed pools, written by the captured kernels
def test_graph_replay_matches_eager_decoding(kernels, kv_cache_dtype):
    # Room for the fp8 rows' quantized blocks and 128-channel fp4 index keys.
    overrides = {"head_dim": 192, "qk_rope_head_dim": 64, "index_head_dim": 128} if kv_cache_dtype == "auto" else None
    prompts = [list(range(10, 10 + n)) for n in (5, 70, 33)]  # 3 sequences: a padded graph of 4
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=0)
    runs = {}
    for graphs in (True, False):
        llm = LLM("tiny", device="cuda", dtype="bfloat16", max_num_seqs=4, cuda_graphs=graphs,
                  kernels=kernels, kv_cache_dtype=kv_cache_dtype, hf_overrides=overrides, progress=False)
        assert llm.engine.decode_runner.uses_cuda_graphs == graphs
        runs[graphs] = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    for a, b in zip(runs[True], runs[False]):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        la = [next(iter(p.values())).logprob for p in a.outputs[0].logprobs]
        lb = [next(iter(p.values())).logprob for p in b.outputs[0].logprobs]
        assert max(abs(x - y) for x, y in zip(la, lb)) < 1e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_enforce_eager_captures_nothing():
    """vLLM's enforce_eager: no decode graphs (the same as cuda_graphs=False), the same tokens."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outs = {}
    for eager in (False, True):
        llm = LLM("tiny", device="cuda", max_num_seqs=2, enforce_eager=eager, progress=False)
        assert llm.engine.decode_runner.uses_cuda_graphs == (not eager)
        outs[eager] = llm.generate(prompt_token_ids=[[5, 6, 7]], sampling_params=params)[0].outputs[0].token_ids
    assert outs[True] == outs[False]
