"""The attention's grouped output projection (o_a_proj, official wo_a) kept in FP8
(`FP8GroupedLinear`) where each group's rows are whole scale blocks, dequantized at load otherwise:
an official-format checkpoint keeps it FP8 and matches transformers on the exactly dequantized
weights; a quantized preset gives the logprobs of the same model with o_a_proj dequantized into the
model dtype (the path before) up to the fp32 sum order; the fallbacks stay nn.Linear."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from oracle import random_prompt
from quantized_writer import make_quantized_oracle
from test_parity_transformers import _hf_logprobs
from v4serve import LLM, SamplingParams
from v4serve.model.quantized import FP8GroupedLinear

WHOLE_BLOCKS = {"o_lora_rank": 32}  # the writer's 16-row blocks: 2 a group (its default 24 is 1.5)


def _o_a(llm) -> list[nn.Module]:
    return [layer.self_attn.o_a_proj for layer in llm.engine.model.model.layers]


def _prompt_logprobs(llm, prompt) -> torch.Tensor:
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    return torch.tensor([lp[t].logprob for lp, t in zip(out.prompt_logprobs[1:], prompt[1:])])


def test_official_checkpoint_keeps_o_a_fp8_and_matches_transformers(tmp_path):
    hf_model = make_quantized_oracle(tmp_path, "official", overrides=WHOLE_BLOCKS)
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", progress=False)
    o_a = _o_a(llm)
    assert all(isinstance(m, FP8GroupedLinear) and m.weight.dtype == torch.float8_e4m3fn for m in o_a)
    assert tuple(o_a[0].weight_scale_inv.shape) == (64 // 16, 256 // 32)  # [G*R / bn, I / bk]
    prompt = random_prompt(48, seed=3)
    err = (_prompt_logprobs(llm, prompt) - _hf_logprobs(hf_model, prompt)).abs().max().item()
    assert err < 1e-3, f"max logprob difference {err:.2e}"


def test_official_checkpoint_with_partial_group_blocks_dequantizes_at_load(tmp_path):
    make_quantized_oracle(tmp_path, "official")  # 24 rows a group, 16-row blocks
    llm = LLM(str(tmp_path), device="cpu", dtype="float32", progress=False)
    assert all(type(m) is nn.Linear and m.weight.dtype == torch.float32 for m in _o_a(llm))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_preset_fp8_o_a_gives_the_dequantized_einsum(dtype):
    llm = LLM("tiny", device="cpu", dtype=dtype, quantization="fp8", hf_overrides={"o_lora_rank": 128},
              progress=False)
    prompt = random_prompt(40, seed=4, vocab=llm.engine.model.config.vocab_size)
    fp8 = _prompt_logprobs(llm, prompt)
    for layer in llm.engine.model.model.layers:  # the path before: the weight dequantized at load
        o_a = layer.self_attn.o_a_proj
        assert isinstance(o_a, FP8GroupedLinear) and o_a.weight.shape == (2 * 128, 4 * 64 // 2)
        plain = nn.Linear(o_a.in_features, o_a.out_features, bias=False, dtype=getattr(torch, dtype))
        plain.weight.data.copy_(o_a.dequantized())
        assert torch.equal(plain.weight.float(), o_a.dequantized())  # power-of-two scales: exact in bf16
        layer.self_attn.o_a_proj = plain
    dequantized = _prompt_logprobs(llm, prompt)
    print(f"{dtype}: max |dlogprob| {(fp8 - dequantized).abs().max().item():.3g}")
    torch.testing.assert_close(fp8, dequantized, rtol=0, atol=1e-5 if dtype == "float32" else 2e-2)  # measured: 0 and 0
