"""FP8 block-scaled linear: the torch reference against a straightforward float64
dequantize-then-matmul, the activation quantization against the V4.1 golden table and a
per-element loop, and the Triton kernels (interpreted on the CPU) against the reference."""

import math
import os

import pytest
import torch
from safetensors.torch import load_file

from v4serve.ops.fp8_linear import act_quant, fp8_linear
from v4serve.ops.weight_formats import quantize_fp8_blocks

GOLDEN = "/work/shared/v41-golden/formats.safetensors"


def _weights(n, k, block, scale_fmt="ue8m0", seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * torch.logspace(-2, 1, n)[:, None]
    return quantize_fp8_blocks(w, block, scale_fmt)


def _naive_linear(x, weight, scale, block, x_eff=None):
    """float64 x @ W^T with W built element by element from the block formula."""
    n, k = weight.shape
    w = weight.double().clone()
    for i in range(n):
        for j0 in range(0, k, block[1]):
            w[i, j0:j0 + block[1]] *= float(scale[i // block[0], j0 // block[1]])
    return (x.double() if x_eff is None else x_eff) @ w.T


def _naive_act_quant(x, block):
    """Per element: s = 2^ceil(log2(max(amax, 1e-4) / 448)) by frexp, q = nearest e4m3, ties to even."""
    m, k = x.shape
    grid = sorted({float(v) for v in torch.arange(256, dtype=torch.int32).to(torch.uint8)
                   .view(torch.float8_e4m3fn).float().tolist() if math.isfinite(v) and 0 <= v <= 448})
    out = torch.empty(m, k, dtype=torch.float64)
    for r in range(m):
        for g0 in range(0, k, block):
            vals = [float(v) for v in x[r, g0:g0 + block].float().tolist()]
            ratio = max(max(abs(v) for v in vals), 1e-4) / 448
            mant, exp = math.frexp(ratio)
            s = math.ldexp(1.0, exp - 1 if mant == 0.5 else exp)
            for j, v in enumerate(vals):
                t = min(abs(v) / s, 448.0)
                lo = max(g for g in grid if g <= t)
                hi = min(g for g in grid if g >= t)
                if hi - t < t - lo or (hi - t == t - lo and grid.index(hi) % 2 == 0):
                    lo = hi
                out[r, g0 + j] = math.copysign(lo * s, v)
    return out


@pytest.mark.parametrize("m, n, k, block", [(1, 20, 36, (8, 16)), (3, 130, 200, (128, 128)), (64, 40, 72, (32, 32))])
@pytest.mark.parametrize("scale_fmt", ["ue8m0", "fp32"])
def test_reference_matches_a_float64_dequantize_then_matmul(m, n, k, block, scale_fmt):
    weight, scale = _weights(n, k, block, scale_fmt)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(7))
    got = fp8_linear(x, weight, scale, block, impl="torch")
    want = _naive_linear(x, weight, scale, block)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    got_bf16 = fp8_linear(x.bfloat16(), weight, scale, block, impl="torch")
    assert got_bf16.dtype == torch.bfloat16
    want_bf16 = _naive_linear(x.bfloat16(), weight, scale, block)
    torch.testing.assert_close(got_bf16.double(), want_bf16, rtol=2**-8, atol=1e-5 * want_bf16.abs().max().item())


@pytest.mark.skipif(not os.path.exists(GOLDEN), reason="needs the V4.1 golden data")
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_act_quant_matches_the_v41_golden_table_bit_for_bit(impl):
    t = load_file(GOLDEN)
    codes, scales = act_quant(t["fp8_e8m0_b32.input"], 32, impl=impl)
    assert torch.equal(codes.view(torch.uint8), t["fp8_e8m0_b32.codes"])
    assert torch.equal(scales, t["fp8_e8m0_b32.scales_f32"])
    assert torch.equal(torch.log2(scales).to(torch.int32) + 127, t["fp8_e8m0_b32.scales"].to(torch.int32))


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("m, k, block", [(3, 40, 32), (2, 300, 128), (1, 16, 128)])
def test_act_quant_matches_a_per_element_loop_with_partial_groups(impl, m, k, block):
    gen = torch.Generator().manual_seed(k)
    x = (torch.randn(m, k, generator=gen) * torch.logspace(-6, 3, k)).bfloat16()
    x[0, :5] = torch.tensor([0.0, -0.0, 1e-30, 448.0, -3.0])
    codes, scales = act_quant(x, block, impl=impl)
    assert scales.shape == (m, -(-k // block))
    got = codes.double() * scales.double().repeat_interleave(block, 1)[:, :k]
    assert torch.equal(got, _naive_act_quant(x, block))


@pytest.mark.parametrize("act_block", [32, 128])
def test_reference_with_act_quant_is_the_product_of_the_quantized_activations(act_block):
    block = (act_block, act_block)
    weight, scale = _weights(48, 160, block)
    x = torch.randn(5, 160, generator=torch.Generator().manual_seed(3)).bfloat16()
    got = fp8_linear(x, weight, scale, block, act_block=act_block, impl="torch")
    want = _naive_linear(x, weight, scale, block, x_eff=_naive_act_quant(x, act_block))
    torch.testing.assert_close(got.double(), want, rtol=2**-8, atol=1e-5 * want.abs().max().item())
    # and it differs from the weight-only numerics (the quantization is not a no-op)
    assert not torch.equal(got, fp8_linear(x, weight, scale, block, impl="torch"))


def test_leading_dims_and_errors():
    weight, scale = _weights(20, 36, (8, 16))
    x = torch.randn(2, 3, 36)
    assert fp8_linear(x, weight, scale, (8, 16), impl="torch").shape == (2, 3, 20)
    with pytest.raises(ValueError, match="scale must be float32"):
        fp8_linear(x, weight, scale, (16, 16), impl="torch")
    with pytest.raises(ValueError, match=r"x \[\.\.\., K\] must match"):
        fp8_linear(x[..., :30], weight, scale, (8, 16), impl="torch")
    with pytest.raises(ValueError, match="act_block"):
        fp8_linear(x, weight, scale, (8, 16), act_block=0, impl="torch")


# Triton (interpreted) against the reference. Under the interpreter the dots are fp32 sums of exact
# products, as in the reference: only the summation order differs, so fp32 outputs agree to 1e-5
# and bf16 outputs to one bf16 ulp (up to 2^-7 relative at the bottom of a binade).
_TRITON_CASES = [
    # m, n, k, block, act_block, scale_fmt
    (1, 20, 36, (8, 16), None, "ue8m0"),      # odd blocks: pre-scaled weight tiles, partial edges
    (3, 130, 200, (128, 128), None, "fp32"),  # post-scaled partials (any fp32 scale), partial blocks
    (3, 130, 200, (128, 128), 128, "ue8m0"),  # the V4 numerics
    (1, 72, 100, (32, 32), 32, "ue8m0"),      # the V4.1 numerics
    (40, 50, 300, (128, 128), 128, "ue8m0"),  # decode tiles of 64 rows, act mode
    (65, 70, 160, (32, 32), None, "ue8m0"),   # prefill tiles, pre-scaled (block_k 32 < BLOCK_K)
    (65, 40, 300, (128, 128), 128, "fp32"),   # prefill tiles, act mode, fp32 weight scales
]


@pytest.mark.parametrize("fp8_hw", [True, False], ids=["fp8", "bytes"])
@pytest.mark.parametrize("m, n, k, block, act_block, scale_fmt", _TRITON_CASES)
def test_triton_matches_the_reference(m, n, k, block, act_block, scale_fmt, fp8_hw):
    from v4serve.ops.fp8_linear_triton import fp8_linear_triton

    weight, scale = _weights(n, k, block, scale_fmt, seed=m + n)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k)).bfloat16()
    want = fp8_linear(x, weight, scale, block, act_block=act_block, impl="torch")
    got = fp8_linear_triton(x, weight, scale, block, act_block, fp8_hw=fp8_hw)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6 * want.float().abs().max().item())
    if act_block is None:
        want32 = fp8_linear(x.float(), weight, scale, block, impl="torch")
        got32 = fp8_linear_triton(x.float(), weight, scale, block, None, fp8_hw=fp8_hw)
        torch.testing.assert_close(got32, want32, rtol=1e-5, atol=1e-5 * want32.abs().max().item())


@pytest.mark.parametrize("act_block", [None, 128])
def test_triton_decode_split_k_sums_in_order(act_block):
    from v4serve.ops.fp8_linear_triton import fp8_linear_triton

    weight, scale = _weights(70, 600, (128, 128))
    x = torch.randn(5, 600, generator=torch.Generator().manual_seed(2)).bfloat16()
    want = fp8_linear(x, weight, scale, act_block=act_block, impl="torch")
    one = fp8_linear_triton(x, weight, scale, (128, 128), act_block, split_k=1)
    three = fp8_linear_triton(x, weight, scale, (128, 128), act_block, split_k=3)
    for got in (one, three):
        torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6 * want.float().abs().max().item())


def test_triton_dispatch_keeps_leading_dims():
    weight, scale = _weights(20, 36, (8, 16))
    x = torch.randn(2, 3, 36)
    got = fp8_linear(x, weight, scale, (8, 16), impl="triton")
    torch.testing.assert_close(got, fp8_linear(x, weight, scale, (8, 16), impl="torch"), rtol=1e-5, atol=1e-5)


# GPU: Flash and Pro projections (out, in), decode and prefill sizes. Not run in this session.
FLASH_PROJECTIONS = {"wq_a": (1024, 4096), "wq_b": (32768, 1024), "wkv": (512, 4096), "wo_b": (4096, 8192),
                     "shared w1": (2048, 4096), "shared w2": (4096, 2048)}
PRO_PROJECTIONS = {"wq_a": (1536, 7168), "wq_b": (65536, 1536), "wkv": (512, 7168), "wo_b": (7168, 16384),
                   "shared w1": (3072, 7168), "shared w2": (7168, 3072)}
_GPU_SHAPES = [(f"{model} {name}", n, k) for model, table in (("flash", FLASH_PROJECTIONS), ("pro", PRO_PROJECTIONS))
               for name, (n, k) in table.items()]


def _gpu_weights(n, k, block, scale_fmt, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return quantize_fp8_blocks(torch.randn(n, k, generator=gen, device="cuda") * k**-0.5, block, scale_fmt)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 8, 64, 2048])
@pytest.mark.parametrize("name, n, k", _GPU_SHAPES, ids=[s[0] for s in _GPU_SHAPES])
def test_triton_on_gpu_at_model_shapes(name, n, k, m):
    weight, scale = _gpu_weights(n, k, (128, 128), "ue8m0", seed=n + k)
    x = torch.randn(m, k, device="cuda", generator=torch.Generator(device="cuda").manual_seed(m)).bfloat16()
    # The activation quantization is the same math in both: bit-identical.
    codes, scales = act_quant(x, 128, impl="triton")
    want_codes, want_scales = act_quant(x, 128, impl="torch")
    assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8)) and torch.equal(scales, want_scales)
    # Weight-only: exact products (e4m3 codes in bf16, power-of-two scales), fp32 sums in another
    # order: one bf16 ulp, plus the fp32 rounding of the sums where they cancel.
    want = fp8_linear(x, weight, scale, impl="torch").float()
    got = fp8_linear(x, weight, scale, impl="triton").float()
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-4 * want.abs().max().item())
    # Official numerics: the FP8 tensor cores sum each 128-long block product with fewer bits than
    # fp32 (DeepSeek-V3 report: about 14), before the fp32 promotion: 2^-6 relative, 1e-3 of max.
    want = fp8_linear(x, weight, scale, act_block=128, impl="torch").float()
    got = fp8_linear(x, weight, scale, act_block=128, impl="triton").float()
    torch.testing.assert_close(got, want, rtol=2**-6, atol=1e-3 * want.abs().max().item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 64])
def test_triton_on_gpu_v41_blocks_and_fp32_scales(m):
    x = torch.randn(m, 5120, device="cuda", generator=torch.Generator(device="cuda").manual_seed(m)).bfloat16()
    for block, act_block, scale_fmt in (((32, 32), 32, "ue8m0"), ((32, 32), None, "ue8m0"), ((128, 128), None, "fp32")):
        weight, scale = _gpu_weights(1280, 5120, block, scale_fmt, seed=m)
        want = fp8_linear(x, weight, scale, block, act_block=act_block, impl="torch").float()
        got = fp8_linear(x, weight, scale, block, act_block=act_block, impl="triton").float()
        tol = (2**-7, 1e-4) if act_block is None else (2**-6, 1e-3)
        torch.testing.assert_close(got, want, rtol=tol[0], atol=tol[1] * want.abs().max().item())
