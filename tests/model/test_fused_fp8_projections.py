"""q_a + kv as one FP8 GEMM (`fusion.fuse_fp8_rows`): the members become views of the stacked codes
and block scales, state_dict keeps the checkpoint names only, and the model gives the logprobs it
gives unfused (GPU: the tiny preset in the official FP8 formats, q_lora_rank a whole 128-row block)."""

from __future__ import annotations

import pytest
import torch

from v4serve import LLM, SamplingParams
from v4serve.model import attention
from v4serve.model.fusion import fuse_fp8_rows
from v4serve.model.quantized import FP8Linear

OVERRIDES = {"q_lora_rank": 128}  # (tiny's 32 is a partial 128-row block: its scales would not stack)


def _fp8_linear(n, k, seed):
    m = FP8Linear(k, n, (128, 128))
    gen = torch.Generator().manual_seed(seed)
    m.weight.data = torch.randn(n, k, generator=gen).clamp(-448, 448).to(torch.float8_e4m3fn)
    m.weight_scale_inv.data = torch.exp2(torch.randint(-8, -4, m.weight_scale_inv.shape, generator=gen).float())
    return m


@torch.inference_mode()
def test_members_become_views_of_one_fp8_linear():
    q_a, kv, odd = _fp8_linear(256, 200, 1), _fp8_linear(72, 200, 2), _fp8_linear(100, 200, 3)
    x = torch.randn(3, 200, generator=torch.Generator().manual_seed(4)).bfloat16()
    want = [m(x) for m in (q_a, kv)]
    fused = fuse_fp8_rows([q_a, kv])
    assert fused is not None and sorted(fused.state_dict()) == []  # non-persistent: the members hold the names
    assert fused.weight.shape == (328, 200) and fused.weight_scale_inv.shape == (3, 2)
    for member in (q_a, kv):
        assert member.weight.untyped_storage().data_ptr() == fused.weight.untyped_storage().data_ptr()
        assert member.weight_scale_inv.untyped_storage().data_ptr() == fused.weight_scale_inv.untyped_storage().data_ptr()
    for got, member_out in zip(fused(x).split([256, 72], dim=-1), want):
        assert torch.equal(got, member_out)  # the same dequantized rows, the same fp32 sums
    assert fuse_fp8_rows([odd, q_a]) is None  # 100 rows: a partial block first, the scales would not stack
    hooked = _fp8_linear(128, 200, 5)
    hooked.register_forward_pre_hook(lambda _m, args: args)  # V4.1's input rounding is such a hook
    assert fuse_fp8_rows([hooked, kv]) is None


def _logprobs(llm):
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, logprobs=3, prompt_logprobs=3)
    out = llm.generate(prompt_token_ids=[[0, 5, 6, 7, 8]], sampling_params=params)[0]
    rows = [{t: lp.logprob for t, lp in pos.items()} for pos in [*out.prompt_logprobs[1:], *out.outputs[0].logprobs]]
    return out.outputs[0].token_ids, rows


def _run_on_gpu(monkeypatch, fuse: bool):
    """(tokens, logprob rows) of the tiny FP8 model on the GPU, decode steps in CUDA graphs."""
    with monkeypatch.context() as patch:
        if not fuse:
            patch.setattr(attention, "fuse_fp8_rows", lambda members: None)
        llm = LLM("tiny", device="cuda", quantization="fp8", hf_overrides=OVERRIDES, progress=False)
    model = llm.engine.model
    layers = [layer.self_attn for layer in model.model.layers]
    assert all((attn.input_proj_fp8 is not None) == fuse and isinstance(attn.q_a_proj, FP8Linear) for attn in layers)
    assert not any(".input_proj" in name for name in model.state_dict())
    out = _logprobs(llm)
    del llm, model, layers
    torch.cuda.empty_cache()
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_model_gives_the_unfused_logprobs(monkeypatch):
    """The tiny model on the GPU (production kernels, decode in CUDA graphs), fused and unfused
    (a GPU test: building the tiny LLM takes ~12 s of the CI's CPU). At tiny's K = 64 no kernel
    splits K, so both should give the same bits; the bound allows the fp32 order of a split where
    a wider N changes it."""
    tokens, rows = _run_on_gpu(monkeypatch, fuse=True)
    want_tokens, want_rows = _run_on_gpu(monkeypatch, fuse=False)
    assert tokens == want_tokens
    for got, want in zip(rows, want_rows, strict=True):
        assert got.keys() == want.keys()
        for t in got:
            assert abs(got[t] - want[t]) < 1e-5
