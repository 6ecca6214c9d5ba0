"""A checkpoint in the official FP8 / MXFP4 format (written by tests/model/quantized_writer.py with
its own quantizer) loads with its weights kept quantized, and matches transformers'
DeepseekV4ForCausalLM in float32 on the exactly dequantized weights: identical greedy tokens over 64
tokens after a 320-token prompt, every logprob within 1e-3 (the CPU path: weight-only numerics)."""

from __future__ import annotations

import pytest
import torch

from oracle import random_prompt
from quantized_writer import FP8_BLOCK, QUANT_CONFIG, make_quantized_oracle
from test_parity_transformers import NEW_TOKENS, PROMPT_LEN, _hf_logprobs
from v4serve import LLM, SamplingParams
from v4serve.model.quantized import FP8Linear, MXFP4Experts


@pytest.fixture(scope="module")
def official(tmp_path_factory):
    path = tmp_path_factory.mktemp("official_fp8")
    return path, make_quantized_oracle(path, "official")


def test_weights_stay_quantized(official):
    path, _ = official
    net = LLM(str(path), device="cpu", dtype="float32", progress=False).engine.model
    layer = net.model.layers[0]
    fp8 = [m for m in net.modules() if isinstance(m, FP8Linear)]
    # The checkpoint's linears (q_a, q_b, kv, o_b, shared gate / up / down in 4 layers; 2 indexers' q_b),
    # and one fused shared gate | up a layer over their stacked codes (model/fusion.py: buffers, not state)
    fused = [m for m in fp8 if "weight" in m._buffers]
    assert len(fp8) - len(fused) == 4 * 7 + 2 and len(fused) == 4
    shared = layer.mlp.shared_experts
    assert shared.gate_up is fused[0] and shared.gate_proj.weight.data_ptr() == shared.gate_up.weight.data_ptr()
    assert all(m.weight.dtype == torch.float8_e4m3fn and m.block == FP8_BLOCK and m.act_block is None for m in fp8)
    assert isinstance(layer.mlp.experts, MXFP4Experts) and layer.mlp.experts.gate_up_proj.dtype == torch.uint8
    # ceil: q_a_proj [40, 64] in (16, 32) blocks has 3 x 2 scales
    assert tuple(layer.self_attn.q_a_proj.weight_scale_inv.shape) == (3, 2)
    # No full-precision copy anywhere: the only float tensors are those the checkpoint holds in float.
    assert not any(p.dtype == torch.float32 and p.dim() == 3 for p in net.parameters())


def test_greedy_tokens_and_logprobs_match_transformers_on_dequantized_weights(official):
    path, hf_model = official
    prompt = random_prompt(PROMPT_LEN, seed=QUANT_CONFIG["seed"])
    with torch.no_grad():
        hf_out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False,
                                   min_new_tokens=NEW_TOKENS)[0, PROMPT_LEN:].tolist()
    llm = LLM(str(path), device="cpu", dtype="float32", max_num_batched_tokens=128, progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=0, prompt_logprobs=0)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0]
    ours = out.outputs[0].token_ids
    assert ours == hf_out, f"first divergence at {next(i for i, (a, b) in enumerate(zip(ours, hf_out)) if a != b)}"
    expected = _hf_logprobs(hf_model, prompt + ours)
    got_prompt = torch.tensor([lp[t].logprob for lp, t in zip(out.prompt_logprobs[1:], prompt[1:])])
    got_gen = torch.tensor([lp[t].logprob for lp, t in zip(out.outputs[0].logprobs, ours)])
    got = torch.cat([got_prompt, got_gen])
    err = (got - expected).abs().max().item()
    assert err < 1e-3, f"max logprob difference {err:.2e}"
