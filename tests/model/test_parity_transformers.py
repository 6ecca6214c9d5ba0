"""Parity with transformers' DeepseekV4ForCausalLM (the independent oracle), float32 on the CPU.

For several tiny random configs saved with `save_pretrained`, a 320-token prompt crossing many
window and compression boundaries: greedy continuations must be identical for 64 tokens, and
the logprobs of every prompt and generated token must be within 1e-3 of transformers'.
"""

from __future__ import annotations

import pytest
import torch

from oracle import ORACLE_CONFIGS, random_prompt, save_hf_checkpoint
from v4serve import LLM, SamplingParams

PROMPT_LEN, NEW_TOKENS = 320, 64


@pytest.fixture(scope="module", params=sorted(ORACLE_CONFIGS))
def oracle(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"hf_{request.param}")
    hf_model = save_hf_checkpoint(request.param, path)
    return request.param, path, hf_model


def _hf_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i+1] | ids[:i+1]) from one full forward of transformers."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_greedy_tokens_and_logprobs_match_transformers(oracle):
    name, path, hf_model = oracle
    prompt = random_prompt(PROMPT_LEN, seed=ORACLE_CONFIGS[name]["seed"])
    with torch.no_grad():
        hf_out = hf_model.generate(
            torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, min_new_tokens=NEW_TOKENS,
        )[0, PROMPT_LEN:].tolist()

    llm = LLM(str(path), device="cpu", dtype="float32", max_num_batched_tokens=128, progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0, prompt_logprobs=0)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    ours = out.outputs[0].token_ids
    assert ours == hf_out, f"config {name}: first divergence at {next(i for i, (a, b) in enumerate(zip(ours, hf_out)) if a != b)}"

    expected = _hf_logprobs(hf_model, prompt + ours)
    got_prompt = torch.tensor([lp[t].logprob for lp, t in zip(out.prompt_logprobs[1:], prompt[1:])])
    got_gen = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, ours)])
    got = torch.cat([got_prompt, got_gen[:-1]])
    assert got.shape == expected[:-1].shape
    err = (got - expected[:-1]).abs().max().item()
    assert err < 1e-3, f"config {name}: max logprob difference {err:.2e}"
    assert abs(got_gen[-1].item() - expected[-1].item()) < 1e-3
