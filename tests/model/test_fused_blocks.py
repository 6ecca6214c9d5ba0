"""The model's hyper-connections and MoE with the Triton kernels (interpreted on the CPU) against the
same modules on the torch ops, with random weights in bf16: a tiny config whose layer 0 routes by
hash and layer 1 by score."""

import pytest
import torch

from v4serve.model.kernels import bind_kernels
from v4serve.model.mhc import HyperConnection, HyperHead
from v4serve.model.moe import MoE
from v4serve.model.norm import RMSNorm
from v4serve.presets import preset_config

CONFIG = preset_config("tiny", {"n_routed_experts": 16, "num_experts_per_tok": 3})


def _randomize(module, seed):
    g = torch.Generator().manual_seed(seed)
    for p in module.parameters():
        p.data = (torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5).to(p.dtype)
    for name, b in module.named_buffers():
        b.copy_(torch.randint(0, CONFIG.n_routed_experts, b.shape, generator=g) if "tid2eid" in name
                else torch.randn(b.shape, generator=g) * 0.1)
    return module


def _streams(T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(T, CONFIG.hc_mult, CONFIG.hidden_size, generator=g).bfloat16()


@torch.inference_mode()
def test_hyper_connection_and_head_kernels_match_torch():
    hc = _randomize(HyperConnection(CONFIG), seed=1)
    head = _randomize(HyperHead(CONFIG), seed=2)
    streams = _streams(5, seed=3)
    out = torch.randn(5, CONFIG.hidden_size).bfloat16()
    def run(impl):
        pre, post, comb = bind_kernels(hc, impl).coefficients(streams)
        return hc.collapse(streams, pre), post, comb

    got = run("triton")
    got_expanded = hc.expand(out, streams, *got[1:])
    got_head = bind_kernels(head, "triton")(streams)
    want = run("torch")
    for g, w in zip(got, want):
        torch.testing.assert_close(g.float(), w.float(), rtol=1e-2, atol=1e-5)
    torch.testing.assert_close(got_expanded, hc.expand(out, streams, *got[1:]), rtol=0, atol=0)
    ffn_hc = bind_kernels(_randomize(HyperConnection(CONFIG), seed=4), "triton")
    fused = ffn_hc.coefficients_after_expand(out, streams, *got[1:])  # one launch: the two ops' bits
    assert torch.equal(fused[0], got_expanded)
    for g, w in zip(fused[1:], ffn_hc.coefficients(got_expanded)):
        assert torch.equal(g, w)
    torch.testing.assert_close(got_head.float(), bind_kernels(head, "torch")(streams).float(), rtol=1e-2, atol=1e-5)
    norm = RMSNorm(CONFIG.hidden_size, CONFIG.rms_norm_eps)
    norm.weight.data = torch.rand(CONFIG.hidden_size) + 0.5
    got_normed = bind_kernels(head, "triton")(streams, norm=norm)  # the final norm in the collapse's launch
    want_normed = norm(bind_kernels(head, "torch")(streams))
    torch.testing.assert_close(got_normed.float(), want_normed.float(), rtol=1e-2, atol=1e-5)


@pytest.mark.parametrize("layer", [0, 1])
@torch.inference_mode()
def test_moe_kernels_match_torch(layer):
    assert CONFIG.mlp_layer_types[layer] == ("hash_moe" if layer == 0 else "moe")
    moe = _randomize(MoE(CONFIG, layer), seed=4 + layer).bfloat16()
    x = torch.randn(6, CONFIG.hidden_size, generator=torch.Generator().manual_seed(5)).bfloat16()
    token_ids = torch.randint(0, CONFIG.vocab_size, (6,), generator=torch.Generator().manual_seed(6))
    got = bind_kernels(moe, "triton")(x, token_ids)
    torch.testing.assert_close(got.float(), bind_kernels(moe, "torch")(x, token_ids).float(), rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("layer", [0, 1])
@torch.inference_mode()
def test_fused_input_projections_give_the_unfused_result(layer):
    """MoE.fuse_projections: router, shared gate and shared up as one GEMM; the members become views
    of the fused rows (one copy in memory) and keep their names in state_dict."""
    moe = bind_kernels(_randomize(MoE(CONFIG, layer), seed=7 + layer), "torch")
    x = torch.randn(4, CONFIG.hidden_size, generator=torch.Generator().manual_seed(8))
    token_ids = torch.randint(0, CONFIG.vocab_size, (4,), generator=torch.Generator().manual_seed(9))
    names = sorted(moe.state_dict())
    want = moe(x, token_ids)
    moe.fuse_projections()
    torch.testing.assert_close(moe(x, token_ids), want, rtol=1e-5, atol=1e-6)
    assert sorted(moe.state_dict()) == names
    fused = moe.input_proj.untyped_storage().data_ptr()
    for member in (moe.gate, moe.shared_experts.gate_proj, moe.shared_experts.up_proj):
        assert member.weight.untyped_storage().data_ptr() == fused
