"""The model on the GPU: Triton kernels against the torch references, end to end (`pytest -m gpu`).

Both engines build the same preset on the same GPU (presets are seeded, so the random weights are
equal) and differ only in `kernels`. Teacher-forced: each prompt runs with prompt_logprobs=1 under
both, in chunked prefill, and a few greedy decode steps follow (their logprobs are compared while
both runs emit the same tokens). Two more runs of the torch path calibrate what "agree" can mean:
one in fp32 (the oracle), and one in bf16 whose embedding output has the lowest bit flipped in 1%
of its elements (the bf16 noise floor: how far the same code drifts after a one-ULP change of its
input). See `_compare` for what is asserted. The issue's bounds for Triton vs torch in bf16 (top-1
>= 99%, |dlogprob| <= 0.05) are printed and enforced only with V4SERVE_GPU_STRICT=1: random-weight
models have near-flat logits, where one ULP anywhere flips top-1 picks, so the torch path misses
them against itself (docs/performance.md has the numbers).

- `tiny`: 4 heads x 64, every layer type, 1100-token prompts in 512-token chunks (kv_cache_dtype
  "bf16": its 64-channel rows have no room for the fp8 format's quantized blocks).
- `deepseek-v4-flash` cut to 4 layers (CSA, HCA, CSA, HCA) with the real attention geometry (64
  heads x 512, rope 64, window 128, index 64 x 128, top-k 512, q/o LoRA 1024, 8 output groups) and
  a small MoE and vocabulary; a 2300-token prompt, so CSA rows reach 575 > 512 and the indexer
  truly selects; with kv_cache_dtype "bf16" and "auto" (packed pools).
"""

from __future__ import annotations

import gc
import os

import pytest
import torch

from v4serve import LLM, SamplingParams

pytestmark = pytest.mark.gpu

DEVICE = os.environ.get("V4SERVE_GPU_TEST_DEVICE", "cuda")
FLASH_4L = {
    "num_hidden_layers": 4,
    "compress_ratios": [4, 128, 4, 128],
    "n_routed_experts": 16,
    "moe_intermediate_size": 256,
    "vocab_size": 4096,
}


def _prompts(n_tokens: list[int], vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=g).tolist() for n in n_tokens]


def _flip_lowest_bits(embedding: torch.nn.Embedding, fraction: float) -> None:
    """Make `embedding` flip the lowest mantissa bit of `fraction` of its bf16 outputs (chosen by a
    generator seeded from the token ids, so every run perturbs the same elements): a one-ULP change."""
    lookup = embedding.forward

    def perturbed(ids: torch.Tensor) -> torch.Tensor:
        x = lookup(ids)
        gen = torch.Generator().manual_seed(int(ids.sum()))
        picked = (torch.rand(x.shape, generator=gen) < fraction).to(x.device)
        bits = x.view(torch.int16)
        return torch.where(picked, bits ^ 1, bits).view(x.dtype)

    embedding.forward = perturbed


def _run(model: str, kernels: str, prompts, budget: int, overrides=None, decode_steps: int = 8, dtype="bfloat16",
         perturb: float = 0.0, kv_cache_dtype: str = "bf16"):
    # cuda_graphs=False: this compares the ops; graph replay against eager decoding is
    # tests/engine/test_gpu_decode.py.
    llm = LLM(model, device=DEVICE, dtype=dtype, kernels=kernels, hf_overrides=overrides, cuda_graphs=False,
              kv_cache_dtype=kv_cache_dtype,
              max_num_seqs=len(prompts), max_num_batched_tokens=budget, max_model_len=4096, progress=False)
    if perturb:
        _flip_lowest_bits(llm.engine.model.model.embed_tokens, perturb)
    params = SamplingParams(temperature=0.0, max_tokens=decode_steps, ignore_eos=True, prompt_logprobs=1, logprobs=1)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    rows = []
    for out in outs:
        prompt_rows = []
        for token, pos in zip(out.prompt_token_ids[1:], out.prompt_logprobs[1:]):
            top1 = min(pos.items(), key=lambda kv: kv[1].rank)[0]
            prompt_rows.append((top1, pos[token].logprob))
        comp = out.outputs[0]
        decode_rows = [(t, pos[t].logprob) for t, pos in zip(comp.token_ids, comp.logprobs)]
        rows.append((prompt_rows, decode_rows))
    del llm
    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return rows


def _stats(a, b):
    """(top-1 agreement, max and mean |dlogprob| of the actual prompt tokens, max |dlogprob| of the
    decode steps while both emitted the same greedy tokens, count of those steps)."""
    agree = total = 0
    diffs = []
    dec_diff, dec_same = 0.0, 0
    for (pa, da), (pb, db) in zip(a, b):
        assert len(pa) == len(pb)
        for (ta, la), (tb, lb) in zip(pa, pb):
            agree += ta == tb
            total += 1
            diffs.append(abs(la - lb))
        for (ta, la), (tb, lb) in zip(da, db):
            if ta != tb:
                break
            dec_same += 1
            dec_diff = max(dec_diff, abs(la - lb))
    return agree / total, max(diffs), sum(diffs) / len(diffs), dec_diff, dec_same


def _compare(label: str, triton_bf16, torch_bf16, torch_bf16_ulp, torch_fp32):
    """Asserted: against the fp32 oracle, the Triton path is as accurate as the torch path in bf16
    (top-1 agreement within 1 point, max and mean |dlogprob| within 1.5x + 0.02), so what separates
    the two bf16 runs is bf16 rounding, not a bug. Printed beside it: Triton vs torch in bf16 (the
    issue's criterion, enforced with V4SERVE_GPU_STRICT=1) and the noise floor it is bounded by."""
    strict = _stats(triton_bf16, torch_bf16)
    floor = _stats(torch_bf16_ulp, torch_bf16)
    tri = _stats(triton_bf16, torch_fp32)
    ref = _stats(torch_bf16, torch_fp32)
    for name, st in (("triton-bf16 vs torch-bf16", strict), ("torch-bf16 one-ULP vs torch-bf16 (noise floor)", floor),
                     ("triton-bf16 vs torch-fp32", tri), ("torch-bf16 vs torch-fp32", ref)):
        print(f"\n[gpu-paths] {label}: {name}: top-1 agreement {st[0]:.4f}, |dlogprob| prompt max {st[1]:.4f} "
              f"mean {st[2]:.5f}, decode max {st[3]:.4f} over {st[4]} equal greedy tokens")
    assert tri[0] >= ref[0] - 0.01, f"{label}: Triton top-1 agreement with fp32 {tri[0]:.4f} vs torch-bf16 {ref[0]:.4f}"
    assert tri[1] <= 1.5 * ref[1] + 0.02, f"{label}: Triton max |dlogprob| vs fp32 {tri[1]:.4f} vs torch-bf16 {ref[1]:.4f}"
    assert tri[2] <= 1.5 * ref[2] + 0.02, f"{label}: Triton mean |dlogprob| vs fp32 {tri[2]:.5f} vs torch-bf16 {ref[2]:.5f}"
    if os.environ.get("V4SERVE_GPU_STRICT") == "1":
        assert strict[0] >= 0.99 and strict[1] <= 0.05 and strict[3] <= 0.05, f"{label}: strict criterion {strict}"


RUNS = (("triton", "bfloat16", 0.0), ("torch", "bfloat16", 0.0), ("torch", "bfloat16", 0.01), ("torch", "float32", 0.0))


@pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tiny_triton_matches_torch():
    prompts = _prompts([1100, 1157], vocab=129280, seed=1)
    runs = [_run("tiny", k, prompts, budget=512, dtype=d, perturb=p) for k, d, p in RUNS]
    _compare("tiny", *runs)


@pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "auto"])  # "auto": packed fp8 / fp4 pools read by the kernels
def test_flash_dims_triton_matches_torch(kv_cache_dtype):
    prompts = _prompts([2300], vocab=FLASH_4L["vocab_size"], seed=2)
    runs = [_run("deepseek-v4-flash", k, prompts, budget=512, overrides=FLASH_4L, dtype=d, perturb=p,
                 kv_cache_dtype=kv_cache_dtype) for k, d, p in RUNS]
    _compare(f"deepseek-v4-flash 4 layers, kv_cache_dtype={kv_cache_dtype}", *runs)
