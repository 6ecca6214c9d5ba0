"""Preemption by recompute in the engine: when KV pages run out, the latest arrival gives its pages
back and is recomputed later, and every request still returns what it returns alone."""

from __future__ import annotations

import pytest

from v4serve import LLM, SamplingParams

PAGE = 32  # the tiny preset's window = page size


def test_preempted_requests_return_their_solo_tokens():
    # 4 requests of up to 3 pages each (prompt + 40 tokens) share 6 pages: some must wait or be preempted.
    prompts = [[5 + i] * n for i, n in enumerate((60, 45, 50, 30))]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    tight = LLM("tiny", device="cpu", max_num_seqs=4, max_model_len=3 * PAGE, num_kv_pages=6, progress=False)
    outs = tight.generate(prompt_token_ids=prompts, sampling_params=params)
    assert tight.engine.scheduler.num_preemptions > 0, "the test must exercise preemption"
    alone = LLM("tiny", device="cpu", max_num_seqs=1, max_model_len=3 * PAGE, progress=False)
    for prompt, out in zip(prompts, outs):
        solo = alone.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
        assert out.outputs[0].token_ids == solo.outputs[0].token_ids


def test_a_cache_smaller_than_one_sequence_is_refused():
    with pytest.raises(ValueError, match=r"KV cache holds 2 pages .* max_model_len 96 needs \(3 pages\)"):
        LLM("tiny", device="cpu", max_model_len=3 * PAGE, num_kv_pages=2, progress=False)
