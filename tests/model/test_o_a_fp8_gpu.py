"""o_a_proj in FP8 on the GPU (`pytest -m gpu`): `deepseek-v4-flash` cut to 2 layers (the real
attention geometry: 8 groups of 1024 rows over 4096 channels; a small MoE and vocabulary) keeps
o_a_proj FP8 (32 MB a layer instead of 64), decodes in CUDA graphs at c = 1 (block-diagonal route)
and c = 3 (a GEMM a group), and gives the logprobs of the same model with o_a_proj dequantized into
bf16 (the path before) within the bf16 noise of a random-weight model (the sums differ in order)."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from v4serve import LLM, SamplingParams
from v4serve.model.quantized import FP8GroupedLinear

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("V4SERVE_GPU_TEST_DEVICE", "cuda")
FLASH_2L = {"num_hidden_layers": 2, "compress_ratios": [4, 128], "n_routed_experts": 16,
            "moe_intermediate_size": 256, "vocab_size": 4096}
# A one-ULP bf16 change moves this model's logprobs by up to ~0.05 (tests/model/test_gpu_paths.py);
# a wrong group or scale moves them by whole units.
TOL = 0.1


def _runs(llm, prompts):
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    out = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    return [(o.outputs[0].token_ids, [lp[t].logprob for lp, t in zip(o.outputs[0].logprobs, o.outputs[0].token_ids)])
            for o in out]


def test_flash_o_a_fp8_decodes_in_graphs_like_the_dequantized_einsum():
    llm = LLM("deepseek-v4-flash", device=DEVICE, hf_overrides=FLASH_2L, kv_cache_memory=1 << 30,
              max_model_len=2048, max_num_seqs=4, progress=False)
    layers = llm.engine.model.model.layers
    for layer in layers:
        o_a = layer.self_attn.o_a_proj
        assert isinstance(o_a, FP8GroupedLinear) and o_a.weight.dtype == torch.float8_e4m3fn
        assert o_a.weight.numel() * o_a.weight.element_size() == 8 * 1024 * 4096  # 32 MiB
    g = torch.Generator().manual_seed(3)
    batches = [[torch.randint(2, 4096, (300,), generator=g).tolist()],
               [torch.randint(2, 4096, (n,), generator=g).tolist() for n in (200, 260, 330)]]
    fp8 = [_runs(llm, prompts) for prompts in batches]
    dtype = llm.engine.model.model.embed_tokens.weight.dtype  # bf16 on the GPU
    for layer in layers:
        o_a = layer.self_attn.o_a_proj
        plain = nn.Linear(o_a.in_features, o_a.out_features, bias=False, device=DEVICE, dtype=dtype)
        plain.weight.data.copy_(o_a.dequantized())
        layer.self_attn.o_a_proj = plain
    dequantized = [_runs(llm, prompts) for prompts in batches]
    compared = 0
    for a_batch, b_batch in zip(fp8, dequantized):
        for (tokens_a, lp_a), (tokens_b, lp_b) in zip(a_batch, b_batch):
            same = next((i for i, (x, y) in enumerate(zip(tokens_a, tokens_b)) if x != y), len(tokens_a))
            diffs = [abs(x - y) for x, y in zip(lp_a[:same + 1], lp_b[:same + 1])]
            print(f"agree for {same} tokens, max |dlogprob| {max(diffs):.3g}")
            assert max(diffs) <= TOL
            compared += len(diffs)
    assert compared >= 4
