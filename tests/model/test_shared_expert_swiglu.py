"""The shared expert's FP8 gate and up as one FP8Linear running the clamped SwiGLU with them
(`SharedExpert.fuse_gate_up`, `fp8_linear_swiglu`): the output of the unfused expert bit for bit
(CPU: the torch references and the interpreted kernels; GPU: the tiny FP8 model's logprobs), and
nothing fused where a member rounds its input first (V4.1) or is not FP8."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from v4serve import LLM, SamplingParams
from v4serve.model import moe
from v4serve.model.moe import SharedExpert
from v4serve.model.quantized import FP8Linear

OVERRIDES = {"q_lora_rank": 128, "moe_intermediate_size": 128}  # (whole 128-row blocks: the scales stack)


def _fp8_linear(n, k, seed):
    m = FP8Linear(k, n, (128, 128))
    gen = torch.Generator().manual_seed(seed)
    m.weight.data = (torch.randn(n, k, generator=gen) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    m.weight_scale_inv.data = torch.exp2(torch.randint(-8, -4, m.weight_scale_inv.shape, generator=gen).float())
    return m


def _shared_expert(i=128, d=256, limit=1.0):
    config = SimpleNamespace(hidden_size=d, moe_intermediate_size=i, n_shared_experts=1, swiglu_limit=limit)
    expert = SharedExpert(config)
    expert.gate_proj, expert.up_proj = _fp8_linear(i, d, 1), _fp8_linear(i, d, 2)
    expert.down_proj = _fp8_linear(d, i, 3)
    return expert


@pytest.mark.parametrize("impl", ["torch", "triton"])
@torch.inference_mode()
def test_fused_shared_expert_gives_the_unfused_bits(impl):
    expert = _shared_expert()
    for module in expert.modules():
        module.impl = impl
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(4)).bfloat16()
    want = expert(x)
    expert.fuse_gate_up()
    assert isinstance(expert.gate_up, FP8Linear) and expert.gate_up.weight.shape == (256, 256)
    assert sorted(expert.state_dict()) == sorted(["gate_proj.weight", "gate_proj.weight_scale_inv", "up_proj.weight",
                                                  "up_proj.weight_scale_inv", "down_proj.weight",
                                                  "down_proj.weight_scale_inv"])
    assert torch.equal(expert(x), want)


def test_not_fused_where_a_member_rounds_its_input_or_is_not_fp8():
    hooked = _shared_expert()
    hooked.gate_proj.register_forward_pre_hook(lambda _m, args: args)  # V4.1's input rounding is such a hook
    hooked.fuse_gate_up()
    assert hooked.gate_up is None
    plain = SharedExpert(SimpleNamespace(hidden_size=64, moe_intermediate_size=128, n_shared_experts=1,
                                         swiglu_limit=1.0))
    plain.fuse_gate_up()
    assert plain.gate_up is None


def _logprobs(monkeypatch, fuse: bool):
    with monkeypatch.context() as patch:
        if not fuse:
            patch.setattr(moe, "fuse_fp8_rows", lambda members: None)
        llm = LLM("tiny", device="cuda", quantization="fp8", hf_overrides=OVERRIDES, progress=False)
    experts = [layer.mlp.shared_experts for layer in llm.engine.model.model.layers]
    assert all((e.gate_up is not None) == fuse for e in experts)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=3, prompt_logprobs=3)
    out = llm.generate(prompt_token_ids=[[0, 5, 6, 7, 8], [0, 9]], sampling_params=params)
    rows = [[{t: lp.logprob for t, lp in pos.items()} for pos in [*o.prompt_logprobs[1:], *o.outputs[0].logprobs]]
            for o in out]
    result = [o.outputs[0].token_ids for o in out], rows
    del llm, experts
    torch.cuda.empty_cache()
    return result


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_model_gives_the_unfused_logprobs(monkeypatch):
    """The tiny FP8 model on the GPU (decode in CUDA graphs, the fused epilogue at decode): the
    kernel and K split are the members', so the logprobs are the same bits."""
    assert _logprobs(monkeypatch, fuse=True) == _logprobs(monkeypatch, fuse=False)
