"""Quantized weights and expert offload on the GPU (`pytest -m gpu`; not run in CI).

- The official-format test checkpoint loads onto the GPU (weights straight to the device, kept
  quantized) and gives the CPU's greedy tokens (fp32, torch kernels: same math, other GEMM order).
- `deepseek-v4-flash` cut to 4 layers, in its official formats (random e4m3 codes and scales,
  random packed experts, all 256 experts per layer), with a quarter of its experts offloaded:
  the same tokens as with every expert on the GPU; the memory map shows the host share.
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from oracle import random_prompt
from quantized_writer import make_quantized_oracle
from v4serve import LLM, SamplingParams
from v4serve.model.loader import offloads_of

pytestmark = pytest.mark.gpu
DEVICE = os.environ.get("V4SERVE_GPU_TEST_DEVICE", "cuda")
KERNELS = os.environ.get("V4SERVE_GPU_QUANT_KERNELS", "auto")  # "torch" until the Triton FP8 / MXFP4 kernels land


def _greedy(llm, prompt, n=16):
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    return llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0].token_ids


def test_official_checkpoint_on_the_gpu_matches_the_cpu(tmp_path):
    make_quantized_oracle(tmp_path / "ck")
    prompt = random_prompt(200, seed=5)
    cpu = _greedy(LLM(str(tmp_path / "ck"), device="cpu", dtype="float32", progress=False), prompt)
    before = torch.cuda.memory_allocated()
    gpu = LLM(str(tmp_path / "ck"), device=DEVICE, dtype="float32", kernels="torch", cuda_graphs=False,
              kv_cache_memory=64 << 20, progress=False)
    assert torch.cuda.memory_allocated() > before
    assert _greedy(gpu, prompt) == cpu


def test_flash_official_formats_with_offload_match_no_offload():
    overrides = {"num_hidden_layers": 4, "compress_ratios": [4, 128, 4, 128]}
    common = dict(device=DEVICE, hf_overrides=overrides, kernels=KERNELS, kv_cache_memory=2 << 30,
                  max_model_len=4096, progress=False)
    prompt = random_prompt(600, seed=6, vocab=129280)
    t0 = time.perf_counter()
    resident = LLM("deepseek-v4-flash", **common)
    print(f"build (4 layers, official formats) {time.perf_counter() - t0:.1f} s")
    expected = _greedy(resident, prompt)
    del resident
    torch.cuda.empty_cache()
    offloaded = LLM("deepseek-v4-flash", cpu_offload_gb=4 * 64 * 12.75 / 1024, **common)  # 64 of 256 per layer
    print("\n".join(offloaded.engine.banner()))
    assert all(len(o.host_experts) == 64 for o in offloads_of(offloaded.engine.model))
    assert _greedy(offloaded, prompt) == expected
    print("fetches per layer", [o.fetches for o in offloads_of(offloaded.engine.model)])
