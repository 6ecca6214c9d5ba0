"""Expert offload (`cpu_offload_gb`) on the CPU: the mechanism (resident experts, device slots,
fetches, LRU eviction, steps split into rounds, placement by measured use) runs for real and gives
bit for bit the logits of no offload (every lm_head output of the run compared with torch.equal),
with the torch ops and with the Triton MoE kernels (interpreter: decode steps on the sort-free
passes, prefill on the sorted ones); one offloaded layer's decode steps on the sort-free passes
(GEMV and tensor-core routes, one and several chunks, launches counted) against the same layer
all resident and the torch reference; the placement arithmetic at full V4-Flash scale."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from oracle import random_prompt
from quantized_writer import make_quantized_oracle
from v4serve import LLM, SamplingParams
from v4serve.config import apply_quantization_override
from v4serve.engine.offload import calibrate_placement
from v4serve.model import quantized, quantized_offload
from v4serve.model.expert_prefetch import link_layer_ahead_prefetch
from v4serve.model.deepseek_v4 import DeepseekV4ForCausalLM
from v4serve.model.loader import offloads_of
from v4serve.model.quantized import EXPERT_TENSORS, MXFP4Experts
from v4serve.model.quantized_install import install, official_plan
from v4serve.model.quantized_offload import ExpertOffload
from v4serve.model.quantized_placement import AUTO_MARGIN_BYTES, GIB, module_bytes, plan_placement
from v4serve.ops import mxfp4_moe_decode
from v4serve.ops.mxfp4_moe_decode import sorted_experts
from v4serve.presets import preset_config

EXPERT_BYTES = 64 * 32 + 64 * 2 + 64 * 16 + 64 * 1  # gate_up + scales, down + scales (hidden 64, moe 32)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("offload")
    make_quantized_oracle(path, "official")
    return path


def _run(llm, prompts, tokens=24):
    """(token ids and logprobs per prompt, every lm_head output of the run in order)."""
    logits = []
    hook = llm.engine.model.lm_head.register_forward_hook(lambda m, i, out: logits.append(out.detach().clone()))
    try:
        params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, logprobs=0)
        outs = llm.generate(prompt_token_ids=prompts, sampling_params=params)
    finally:
        hook.remove()
    return [(o.outputs[0].token_ids, [next(iter(lp.values())).logprob for lp in o.outputs[0].logprobs])
            for o in outs], logits


def _assert_same(got, expected):
    """Bit-identical: the same tokens and logprobs, and every logits tensor of the run equal (a
    step split into passes keeps each pick's expert output from its expert's pass and combines
    once, with the groups and tiles of the resident run)."""
    (runs, logits), (want_runs, want_logits) = got, expected
    assert runs == want_runs
    assert len(logits) == len(want_logits)
    for a, b in zip(logits, want_logits):
        assert torch.equal(a, b), f"max |d logit| = {(a - b).abs().max().item():.3g}"


def _bind_moe(llm, impl):
    for m in llm.engine.model.modules():
        if isinstance(m, MXFP4Experts):
            m.impl = impl


def test_offload_gives_the_same_tokens_as_no_offload(checkpoint):
    prompts = [random_prompt(150, seed=11), random_prompt(40, seed=12)]
    # Prefix caching off: the prompts run twice on one engine and every forward's logits are compared.
    kwargs = dict(device="cpu", dtype="float32", max_num_batched_tokens=64, enable_prefix_caching=False,
                  progress=False)
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
    assert any(off.multi_chunk_steps > 0 for off in offloads)  # a chunk needed more offloaded experts than slots
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
        assert not off.slots and all(int(off.index[x]) == -1 for x in off.host_experts)
    # The engine's calibration run: counts from zero, every pick of its requests counted, then placed.
    summary = calibrate_placement(llm.engine, prompt_tokens=16, requests=2, output_tokens=2)
    assert summary["tokens"] == 2 * (8 + 2) and summary["use"]["layers"] == 4
    # top-2 picks of 16 prompt tokens and 2 decode rows, or 4 with the step that overlapped decode
    # launches before the last tokens are read (its outputs are dropped, its routing counted)
    assert len({int(off.counts.sum()) for off in offloads}) == 1
    assert 2 * (16 + 2) <= int(offloads[0].counts.sum()) <= 2 * (16 + 4)
    for off in offloads:
        assert set(off.resident) == set(torch.argsort(off.counts, descending=True, stable=True)[:2].tolist())
    before = sum(off.fetches for off in offloads)
    _assert_same(_run(llm, prompts), expected)
    assert sum(off.fetches for off in offloads) > before

    # The CUDA schedule (resident pass while the copies run, then the slot passes) on the CPU.
    for off in offloads:
        off.overlap = True
    _assert_same(_run(llm, prompts), expected)

    # Layer-ahead prefetch: layers 1..3 get their picks guessed by the layer before; it only fills
    # slots, so the logits stay those of no offload; the guesses are fetched (not counted as picks).
    assert link_layer_ahead_prefetch(llm.engine.model) == 3
    counts, fetches = [int(o.counts.sum()) for o in offloads], [o.fetches for o in offloads]
    _assert_same(_run(llm, prompts), expected)
    grown = [int(o.counts.sum()) - c for o, c in zip(offloads, counts)]
    assert len(set(grown)) == 1  # every layer counted the same real picks, none of the guesses
    assert all(o.fetches > f for o, f in zip(offloads, fetches))


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


def test_offload_with_the_triton_moe_kernels_is_bit_identical(checkpoint):
    """The Triton MoE ops (sort, MXFP4 grouped matmul, SwiGLU, combine: the kernels the GPU runs,
    here in the interpreter) with every expert resident and with 6 of 8 experts offloaded to 4
    slots, in the CUDA pass schedule (`overlap`: a resident pass, then slot passes), a prefill
    step split into passes included. (The CPU schedule runs above with the torch ops.)"""
    prompts = [random_prompt(32, seed=13)]
    kwargs = dict(device="cpu", dtype="float32", max_num_batched_tokens=32, enable_prefix_caching=False,
                  progress=False)
    resident = LLM(str(checkpoint), **kwargs)
    _bind_moe(resident, "triton")
    expected = _run(resident, prompts, tokens=2)
    llm = LLM(str(checkpoint), cpu_offload_gb=24 * EXPERT_BYTES / GIB, **kwargs)
    _bind_moe(llm, "triton")
    offloads = offloads_of(llm.engine.model)
    for off in offloads:
        off.overlap = True
    passes = []
    pass_outputs = MXFP4Experts.pass_outputs
    with pytest.MonkeyPatch.context() as patch:  # the decode steps' passes, counted
        patch.setattr(MXFP4Experts, "pass_outputs", lambda *args: passes.append(1) or pass_outputs(*args))
        _assert_same(_run(llm, prompts, tokens=2), expected)
    assert any(off.multi_chunk_steps > 0 for off in offloads)
    assert passes and len(passes) % (2 * len(offloads)) == 0  # decode: a resident pass and chunk 0's a layer


def _packed_experts(e, d, i, seed):
    """MXFP4 gate_up [E, 2I, D/2] and down [E, D, I/2] with their scales, bytes 118..124 (|w| <= 0.75)."""
    gen = torch.Generator().manual_seed(seed)

    def packed(rows, cols):
        w = torch.randint(0, 256, (e, rows, cols // 2), generator=gen, dtype=torch.int32)
        s = torch.randint(118, 125, (e, rows, cols // 32), generator=gen, dtype=torch.int32)
        return w.to(torch.uint8), s.to(torch.uint8)

    return (*packed(2 * i, d), *packed(d, i))


def _layer_pair(tensors, host, n_slots, sizes=None, tensor_cores=False):
    """The tiny preset's MXFP4 layer (`sizes`: hidden / moe sizes) holding `tensors`, all resident,
    and the same layer with `host` in host memory and `n_slots` slots (installed as the loader
    does), in the CUDA schedule (a resident pass beside the fetch); Triton kernels, decode route
    bound (`tensor_cores`) once the weights are in."""
    config = preset_config("tiny", sizes or {})
    resident, offloaded = MXFP4Experts(config), MXFP4Experts(config)
    offload = ExpertOffload(offloaded, host, n_slots, torch.device("cpu"))
    for name, value in zip(EXPERT_TENSORS, tensors):
        getattr(resident, name).data.copy_(value)
        for e in range(value.shape[0]):
            offload.dest(name, e).copy_(value[e])
        del offloaded._parameters[name]
    offloaded.offload, offload.overlap = offload, True
    for module in (resident, offloaded):
        module.impl = "triton"
        assert module.bind_decode(tensor_cores) is tensor_cores
    return resident, offloaded


def _count_launches(monkeypatch) -> Counter:
    """Calls of the MoE launches an offloaded layer can make (each one kernel launch), counted."""
    counts = Counter()

    def counted(owner, attr, name):
        fn = getattr(owner, attr)

        def call(*args, **kwargs):
            counts[name] += 1
            return fn(*args, **kwargs)
        monkeypatch.setattr(owner, attr, call)

    counted(mxfp4_moe_decode, "mxfp4_moe_pick_triton", "gemv")
    counted(mxfp4_moe_decode, "mxfp4_moe_mma_triton", "tensor_cores")
    counted(quantized, "moe_sort", "sort")
    counted(quantized_offload, "moe_combine", "combine")
    counted(quantized_offload, "expert_cache_plan", "plan")
    return counts


def _decode_step(tokens, d, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (0.5 * torch.randn(tokens, d, generator=gen)).to(torch.bfloat16)
    return x, torch.rand(tokens, 2, generator=gen), torch.randn(tokens, d, generator=gen).to(torch.bfloat16)


def test_offloaded_decode_steps_run_sort_free_passes_with_the_resident_bits(monkeypatch):
    """8 experts, top-2, hidden 64, moe 32; experts 5, 6, 7 in host memory, 2 slots. Decode steps
    (<= 0.75 E picks) run the sort-free passes: a resident pass, then each chunk's pass (plan, then
    gate_up and down skipping the other passes' picks), one combine, no sort; the output has the
    all-resident layer's bits and lies near the torch reference. Chunks from shapes:
    ceil(min(picks, 3) / 2)."""
    tensors = _packed_experts(8, 64, 32, seed=21)
    resident, layer = _layer_pair(tensors, host=[5, 6, 7], n_slots=2)
    launches = _count_launches(monkeypatch)
    steps = [([[0, 5]], 1),  # one host expert: one chunk, 5 fetched
             ([[5, 0], [6, 7], [1, 5]], 2),  # chunk 0: 5 held, 6 fetched; chunk 1: 7 evicts 5
             ([[3, 4], [0, 1], [2, 2]], 2),  # no host expert: the chunks have no member
             ([[5, 6], [6, 1], [5, 3]], 2)]  # 6 held, 5 evicts 7; chunk 1 empty
    for step, (picks, chunks) in enumerate(steps):
        experts = torch.tensor(picks)
        x, weights, add = _decode_step(len(picks), 64, seed=step)
        want = resident(x, experts, weights, add)
        launches.clear()
        got = layer(x, experts, weights, add)
        assert torch.equal(got, want), step
        assert launches == {"plan": chunks, "gemv": 2 + 2 * chunks, "combine": 1}, step
        ref = sorted_experts(x, experts, weights, tensors, resident.limit, add, impl="torch")
        torch.testing.assert_close(got.float(), ref.float(), rtol=2**-7, atol=1e-2 * ref.abs().max().item())
    assert layer.offload.fetches == 1 + 2 + 0 + 1

    x, weights, add = _decode_step(3, 64, seed=9)
    experts = torch.tensor([[5, 6], [0, 7], [6, 2]])
    want = resident(x, experts, weights, add)
    layer.offload.overlap = False  # the CPU schedule: the resident picks join chunk 0's pass
    launches.clear()
    assert torch.equal(layer(x, experts, weights, add), want)
    assert launches == {"plan": 2, "gemv": 4, "combine": 1}
    monkeypatch.setattr(quantized_offload, "SORT_FREE_PASSES", False)  # the rule off: sorted passes, same bits
    launches.clear()
    assert torch.equal(layer(x, experts, weights, add), want)
    assert launches["sort"] == 2 and launches["gemv"] == 0 and launches["combine"] == 1


def test_offloaded_decode_steps_on_tensor_cores_keep_the_resident_bits(monkeypatch):
    """The tensor-core route (`bind_decode(True)`, the `tl` kernel in the interpreter; D = I = 256:
    one MMA K step): an offloaded layer's passes take it too, with the all-resident layer's bits."""
    tensors = _packed_experts(8, 256, 256, seed=22)
    resident, layer = _layer_pair(tensors, host=[6, 7], n_slots=2,
                                  sizes={"hidden_size": 256, "moe_intermediate_size": 256}, tensor_cores=True)
    launches = _count_launches(monkeypatch)
    experts = torch.tensor([[6, 0], [7, 6], [1, 2]])  # host experts 6, 7: one chunk
    x, weights, add = _decode_step(3, 256, seed=23)
    want = resident(x, experts, weights, add)
    launches.clear()
    assert torch.equal(layer(x, experts, weights, add), want)
    assert launches == {"plan": 1, "tensor_cores": 4, "combine": 1}


def test_memory_summary_counts_weights_on_a_device_named_with_or_without_an_index():
    """The V4.1 bench printed 0 GiB of device weights and every weight as an Engram table: tensors
    on "cuda:0" were compared with the engine's torch.device("cuda"). The same mismatch on the CPU:
    tensors live on "cpu", the device is named "cpu:0"."""
    from v4serve.engine.offload import memory_summary

    model = torch.nn.Linear(2048, 4096, bias=False)  # 32 MiB: 0.03 GiB as the summary rounds
    expected = round(2048 * 4096 * 4 / 2**30, 2)
    assert expected > 0
    for device in (torch.device("cpu"), torch.device("cpu", 0)):
        m = memory_summary(model, 0, device)
        assert m["device_weights"] == expected and m["engram_tables"] == 0, (device, m)


def test_memory_summary_counts_a_fused_projection_once():
    """Fused projections (model/fusion.py) keep one stacked weight as a buffer and make each
    member's weight a view of its rows: the summary counted those bytes twice."""
    from v4serve.engine.offload import memory_summary
    from v4serve.model.fusion import fuse_rows

    model = torch.nn.Module()
    model.a = torch.nn.Linear(2048, 4096, bias=False)
    model.b = torch.nn.Linear(2048, 4096, bias=False)
    expected = round(2 * 2048 * 4096 * 4 / 2**30, 2)
    assert memory_summary(model, 0, torch.device("cpu"))["device_weights"] == expected
    model.register_buffer("fused", fuse_rows([model.a, model.b]), persistent=False)
    assert memory_summary(model, 0, torch.device("cpu"))["device_weights"] == expected
