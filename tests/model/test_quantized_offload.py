"""Expert offload (`cpu_offload_gb`) on the CPU: the mechanism (resident experts, device slots,
fetches, LRU eviction, steps split into rounds, placement by measured use) runs for real and gives
the same tokens and logprobs as no offload; the placement arithmetic at full V4-Flash scale."""

from __future__ import annotations

import pytest
import torch

from oracle import random_prompt
from quantized_writer import make_quantized_oracle
from v4serve import LLM, SamplingParams
from v4serve.config import apply_quantization_override
from v4serve.model.deepseek_v4 import DeepseekV4ForCausalLM
from v4serve.model.loader import offloads_of
from v4serve.model.quantized import MXFP4Experts
from v4serve.model.quantized_install import install, official_plan
from v4serve.model.quantized_placement import AUTO_MARGIN_BYTES, GIB, module_bytes, plan_placement
from v4serve.presets import preset_config

EXPERT_BYTES = 64 * 32 + 64 * 2 + 64 * 16 + 64 * 1  # gate_up + scales, down + scales (hidden 64, moe 32)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("offload")
    make_quantized_oracle(path, "official")
    return path


def _run(llm, prompts, tokens=24):
    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=0)
    outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    return [(o.outputs[0].token_ids, [next(iter(lp.values())).logprob for lp in o.outputs[0].logprobs]) for o in outs]


def _assert_same(got, expected):
    """Identical tokens; logprobs equal up to fp32 summation order (a step split into rounds adds
    the rounds' partial expert sums, and the per-expert matmuls see other row counts)."""
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(got, expected, strict=True):
        assert tokens == want_tokens
        assert max(abs(a - b) for a, b in zip(logprobs, want_logprobs)) < 1e-5


def test_offload_gives_the_same_tokens_as_no_offload(checkpoint):
    prompts = [random_prompt(150, seed=11), random_prompt(40, seed=12)]
    kwargs = dict(device="cpu", dtype="float32", max_num_batched_tokens=64, progress=False)
    expected = _run(LLM(str(checkpoint), **kwargs), prompts)
    # 6 of the 8 experts of each of the 4 layers in host memory, 4 slots per layer (2 * top-2).
    llm = LLM(str(checkpoint), cpu_offload_gb=24 * EXPERT_BYTES / GIB, **kwargs)
    offloads = offloads_of(llm.engine.model)
    assert len(offloads) == 4
    for off in offloads:
        assert len(off.host_experts) == 6 and len(off.resident) == 2 and off.n_slots == 4
        assert off.device_tensors[0].shape[0] == 2 + 4 and off.host_tensors[0].shape[0] == 6
    _assert_same(_run(llm, prompts), expected)
    # (the random routers are skewed: some layers pick only a few experts, so "some layer")
    assert any(off.fetches > off.n_slots for off in offloads)  # slots reused: evicted, fetched again
    assert any(off.split_steps > 0 for off in offloads)  # a chunk needed more offloaded experts than slots
    for off in offloads:
        assert off.fetches > 0 and int(off.counts.sum()) == 2 * (150 + 40 + 2 * 23)  # top-2 picks per token
        held = [x for x in off.slots]
        assert all(int(off.index[x]) == 2 + off.slots[x] for x in held)
        assert all(int(off.index[x]) == -1 for x in off.host_experts if x not in off.slots)
    assert any("weights in host memory" in line and "24 routed experts in 4 layers" in line
               for line in llm.engine.banner())

    # Placement by measured use: the most picked experts become resident; tokens do not change.
    for off in offloads:
        off.place_by_counts()
        hottest = set(torch.argsort(off.counts, descending=True, stable=True)[:2].tolist())
        assert set(off.resident) == hottest
        assert all(int(off.index[x]) == off.row_of[x] for x in off.resident)
    before = sum(off.fetches for off in offloads)
    _assert_same(_run(llm, prompts), expected)
    assert sum(off.fetches for off in offloads) > before

    # The CUDA schedule (resident pass while the copies run, then the slot passes) on the CPU.
    for off in offloads:
        off.overlap = True
    _assert_same(_run(llm, prompts), expected)


def test_auto_fills_the_gpu_first_and_keeps_the_kv_budget():
    """V4-Flash in its official formats (built on "meta": no memory) on a 140 GiB GPU keeping 10 GiB
    for the KV cache: just enough experts go to the host for weights + slots + KV + margin to fit."""
    config = apply_quantization_override(preset_config("deepseek-v4-flash"), None)
    with torch.device("meta"):
        net = DeepseekV4ForCausalLM(config)
    install(net, official_plan(net, config), config.quantization, config)
    per_expert = next(m for m in net.modules() if isinstance(m, MXFP4Experts)).expert_bytes()
    free, reserve = 140 * GIB, 10 * GIB
    placement = plan_placement(net, config, "auto", torch.device("cuda"), reserve, free_bytes=free)
    n_host = sum(len(v) for v in placement.host_experts.values())
    slots = len(placement.host_experts) * placement.n_slots * per_expert
    on_gpu = module_bytes(net) - n_host * per_expert + slots
    assert on_gpu + reserve + AUTO_MARGIN_BYTES <= free < on_gpu + reserve + AUTO_MARGIN_BYTES + per_expert * 43
    assert len(placement.host_experts) == 43 and max(map(len, placement.host_experts.values())) - min(
        map(len, placement.host_experts.values())) <= 1
    assert not plan_placement(net, config, "auto", torch.device("cuda"), 0, free_bytes=200 * GIB)
    assert not plan_placement(net, config, "auto", torch.device("cpu"), reserve)
    fixed = plan_placement(net, config, 40, torch.device("cuda"), 0)
    assert sum(map(len, fixed.host_experts.values())) == -(-40 * GIB // per_expert)
