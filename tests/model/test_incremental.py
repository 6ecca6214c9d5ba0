"""Prefill in one piece, in chunks of several sizes, and token by token give the same logits;
a batch of mixed-length prompts gives each prompt its solo tokens."""

from __future__ import annotations

import pytest
import torch

from oracle import random_prompt, save_hf_checkpoint
from v4serve import LLM, SamplingParams


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf_b")
    save_hf_checkpoint("b", path)  # window 16, CSA 4 and HCA 8: many boundaries in few tokens
    return str(path)


def _prompt_logprobs(checkpoint: str, prompt: list[int], budget: int) -> torch.Tensor:
    llm = LLM(checkpoint, device="cpu", dtype="float32", max_num_seqs=1, max_num_batched_tokens=budget, progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=3, logprobs=3)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    rows = [sorted((tid, lp.logprob) for tid, lp in pos.items()) for pos in out.prompt_logprobs[1:]]
    rows += [sorted((tid, lp.logprob) for tid, lp in pos.items()) for pos in out.outputs[0].logprobs]
    return out.outputs[0].token_ids, rows


def test_chunk_sizes_and_token_by_token_agree(checkpoint):
    prompt = random_prompt(150, seed=11)
    ref_tokens, ref_rows = _prompt_logprobs(checkpoint, prompt, budget=512)
    for budget in (37, 16, 5, 1):  # 1 = token by token
        tokens, rows = _prompt_logprobs(checkpoint, prompt, budget)
        assert tokens == ref_tokens, f"budget {budget}"
        for i, (a, b) in enumerate(zip(rows, ref_rows)):
            assert [t for t, _ in a] == [t for t, _ in b], f"budget {budget}, position {i}: top tokens differ"
            diff = max(abs(x - y) for (_, x), (_, y) in zip(a, b))
            assert diff < 1e-4, f"budget {budget}, position {i}: logprob differs by {diff:.2e}"


def test_mixed_length_batch_matches_solo_runs(checkpoint):
    prompts = [random_prompt(n, seed=n) for n in (3, 40, 97, 17, 130)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    llm = LLM(checkpoint, device="cpu", dtype="float32", max_num_seqs=8, max_num_batched_tokens=64, progress=False)
    together = [o.outputs[0].token_ids for o in llm.generate(prompt_token_ids=prompts, sampling_params=params)]
    solo_llm = LLM(checkpoint, device="cpu", dtype="float32", max_num_seqs=1, max_num_batched_tokens=512, progress=False)
    for prompt, tokens in zip(prompts, together):
        solo = solo_llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0].token_ids
        assert tokens == solo
        assert len(tokens) == 24
