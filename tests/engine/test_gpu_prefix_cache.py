"""Prefix caching on the GPU: a turn that hits a cached system prompt gives the tokens and logprobs
of the same prompt run on an engine without prefix caching, with the Triton kernels, CUDA-graph
decode, bf16 and packed KV rows (GPU only; the CPU tests check the logits bit for bit in float32
with the torch references: test_prefix_cache_exact.py).

Both engines prefill in chunks of the same step budget (a whole number of pages), so the hit's
chunks after the cached part have the shapes of the cold run's and the same bits are expected:
the test asks for equality, not closeness."""

from __future__ import annotations

import random

import pytest
import torch

from v4serve import LLM, SamplingParams

pytestmark = pytest.mark.gpu

PAGE = 32  # the tiny preset's window = page size
BUDGET = 2 * PAGE  # the step's token budget: prefix caching's chunk grid


def _ids(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10, 1000) for _ in range(n)]


def _tokens_and_logprobs(llm: LLM, prompt: list[int]) -> tuple[list[int], list[float]]:
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0]
    return list(out.token_ids), [next(iter(p.values())).logprob for p in out.logprobs]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "auto"])
def test_a_turn_after_a_cached_system_prompt_gives_what_an_uncached_run_gives(kv_cache_dtype):
    # Room for the fp8 rows' quantized blocks and 128-channel fp4 index keys (as test_gpu_decode.py).
    overrides = {"head_dim": 192, "qk_rope_head_dim": 64, "index_head_dim": 128} if kv_cache_dtype == "auto" else None
    system = _ids(3 * BUDGET, seed=0)  # 6 pages, ends on the grid
    first_turn, second_turn = system + _ids(21, seed=1), system + _ids(13, seed=2)
    common = dict(device="cuda", dtype="bfloat16", max_num_seqs=2, max_num_batched_tokens=BUDGET,
                  kv_cache_dtype=kv_cache_dtype, hf_overrides=overrides, progress=False)

    cached = LLM("tiny", enable_prefix_caching=True, **common)
    _tokens_and_logprobs(cached, first_turn)
    hits_before = cached.engine.cache.prefix.hits
    hit = _tokens_and_logprobs(cached, second_turn)
    assert cached.engine.cache.prefix.hits - hits_before == len(system)  # the whole system prompt was reused

    uncached = LLM("tiny", enable_prefix_caching=False, **common)
    assert uncached.engine.cache.prefix is None
    cold = _tokens_and_logprobs(uncached, second_turn)
    assert hit[0] == cold[0]
    assert hit[1] == cold[1], f"max |logprob diff| {max(abs(a - b) for a, b in zip(hit[1], cold[1]))}"
