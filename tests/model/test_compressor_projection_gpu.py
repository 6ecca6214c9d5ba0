"""The compressor's and indexer's fp32 projections of a V4-Flash CSA layer once fused on the GPU
(`pytest -m gpu`): their weights hold bf16 values (the checkpoint's tensors are bf16), so the fused
matrix is stored as bf16 (half the bytes a decode step reads) and multiplied into fp32 by cuBLAS
(`fusion.fp32_product`); the result is the unfused fp32 GEMMs' up to the order of the fp32 sums.

The products of bf16 values are exact in fp32, so two GEMMs differ only by how they order the sums:
each is within gamma_K * sum_k |x_k w_k| of the exact dot product (gamma_K ~ K * 2^-24, any order),
so they are within twice that of each other. A fixed atol / rtol is not such a bound: one element
in 524,288 of a T = 512 run differed by 1.17e-5 (relative 7e-4, a sum near cancellation)."""

import pytest
import torch
import torch.nn.functional as F

from v4serve.layer_plan import layer_plans
from v4serve.model.attention import Attention
from v4serve.model.loader import BF16_ON_DISK, FP32_PARAMETERS
from v4serve.presets import preset_config

pytestmark = pytest.mark.gpu


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("T", [1, 8, 512])
@torch.inference_mode()
def test_fused_compressor_projection_is_bf16_and_exact_up_to_sum_order(T):
    config = preset_config("deepseek-v4-flash", {"num_hidden_layers": 4})
    plan = layer_plans(config)[2]  # CSA: compressor + indexer
    assert plan.ratio == 4
    attn = Attention(config, plan).cuda()
    g = torch.Generator(device="cuda").manual_seed(T)
    for name, p in attn.named_parameters():
        values = torch.randn(p.shape, generator=g, device="cuda") * 0.02
        keep_fp32 = any(f in name for f in FP32_PARAMETERS)
        p.data = values.bfloat16().float() if any(f in name for f in BF16_ON_DISK) else \
            (values if keep_fp32 else values.bfloat16())
    members = attn._compressor_projections()
    x = torch.randn(T, config.hidden_size, generator=g, device="cuda").bfloat16()
    weights = [m.weight.detach().float().clone() for m in members]
    want = [F.linear(x.float(), w) for w in weights]
    fp32_bytes = sum(m.weight.numel() * 4 for m in members)
    attn.fuse_projections()
    assert attn.compressor_proj.dtype == torch.bfloat16
    assert attn.compressor_proj.numel() * attn.compressor_proj.element_size() == fp32_bytes // 2
    K = x.shape[1]
    for got, w, weight in zip(attn._project_compressor_input(x), want, weights, strict=True):
        assert got.dtype == torch.float32
        bound = 2 * K * 2.0**-24 * (x.float().abs() @ weight.abs().T)
        assert ((got - w).abs() <= bound).all(), ((got - w).abs() - bound).max()
