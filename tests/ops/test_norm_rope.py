"""RMSNorm + interleaved partial RoPE: the torch reference against a per-element loop of the
formulas, the Triton kernel (interpreted on the CPU) against the reference, and the kernel at
DeepSeek-V4 shapes on the GPU."""

import math

import pytest
import torch

from v4serve.ops.norm_rope import rms_norm_rope


def _inputs(shape, rope_half, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 3).to(dtype)
    weight = torch.rand(shape[-1], generator=gen) + 0.5
    positions = torch.randint(0, 40000, (shape[0],), generator=gen)
    inv_freq = 1.0 / (10000.0 ** (torch.arange(rope_half, dtype=torch.float32) / rope_half))
    angles = positions.float()[:, None] * inv_freq[None, :]
    return x, weight, angles.cos(), angles.sin()


def _loop(x, eps, weight, cos, sin, inverse):
    """Row by row, channel by channel, in float64."""
    t, d = x.shape[0], x.shape[-1]
    rows = x.double().reshape(t, -1, d)
    out = torch.empty_like(rows)
    for i in range(t):
        for h in range(rows.shape[1]):
            v = rows[i, h].tolist()
            if eps is not None:
                scale = 1 / math.sqrt(sum(u * u for u in v) / d + eps)
                v = [u * scale * (1.0 if weight is None else float(weight[c])) for c, u in enumerate(v)]
            if cos is not None:
                first = d - 2 * cos.shape[1]
                for j in range(cos.shape[1]):
                    c, s = float(cos[i, j]), float(sin[i, j]) * (-1 if inverse else 1)
                    a, b = v[first + 2 * j], v[first + 2 * j + 1]
                    v[first + 2 * j], v[first + 2 * j + 1] = a * c - b * s, b * c + a * s
            out[i, h] = torch.tensor(v, dtype=torch.float64)
    return out.reshape(x.shape)


MODES = {  # name: (norm, weighted, rope, inverse)
    "weighted norm": (True, True, False, False),
    "weightless norm + rope": (True, False, True, False),
    "weighted norm + rope": (True, True, True, False),
    "rope": (False, False, True, False),
    "inverse rope": (False, False, True, True),
}


def _call(mode, x, weight, cos, sin, impl):
    norm, weighted, rope, inverse = MODES[mode]
    return rms_norm_rope(x, 1e-6 if norm else None, weight if weighted else None, cos if rope else None,
                         sin if rope else None, inverse, impl=impl)


@pytest.mark.parametrize("mode", list(MODES))
def test_reference_matches_the_formulas(mode):
    x, weight, cos, sin = _inputs((3, 2, 24), 4, seed=1)
    norm, weighted, rope, inverse = MODES[mode]
    want = _loop(x, 1e-6 if norm else None, weight if weighted else None, cos if rope else None, sin, inverse)
    torch.testing.assert_close(_call(mode, x, weight, cos, sin, "torch").double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape, rope_half", [((5, 64), 8), ((3, 4, 48), 8), ((2, 3, 40), 20)])
def test_triton_kernel_matches_the_reference_fp32(mode, shape, rope_half):
    x, weight, cos, sin = _inputs(shape, rope_half, seed=shape[-1])
    want = _call(mode, x, weight, cos, sin, "torch")
    got = _call(mode, x, weight, cos, sin, "triton")
    assert got.shape == x.shape and got.dtype == x.dtype
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", list(MODES))
def test_triton_kernel_matches_the_reference_bf16(mode):
    x, weight, cos, sin = _inputs((4, 3, 64), 16, dtype=torch.bfloat16, seed=7)
    want = _call(mode, x, weight, cos, sin, "torch").float()
    got = _call(mode, x, weight, cos, sin, "triton").float()
    # The same rounding points; sums in another order may move a value by one bf16 step.
    torch.testing.assert_close(got, want, rtol=8e-3, atol=8e-3)


def test_bad_arguments_are_named():
    x, weight, cos, sin = _inputs((3, 16), 4)
    with pytest.raises(ValueError, match="weight must be"):
        rms_norm_rope(x, None, weight)
    with pytest.raises(ValueError, match="cos and sin must be given together"):
        rms_norm_rope(x, cos=cos)
    with pytest.raises(ValueError, match=r"cos and sin must be \[3, R\]"):
        rms_norm_rope(x, cos=cos[:2], sin=sin[:2])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("shape", [(64, 64, 512), (17, 512), (33, 4096)])
def test_triton_kernel_at_model_shapes_on_gpu(mode, shape):
    x, weight, cos, sin = (t.cuda() for t in _inputs(shape, 32, dtype=torch.bfloat16, seed=3))
    want = _call(mode, x, weight, cos, sin, "torch").float()
    got = _call(mode, x, weight, cos, sin, "triton").float()
    torch.testing.assert_close(got, want, rtol=8e-3, atol=8e-3)
    assert (got != want).float().mean() < 0.01  # nearly all values bit-identical


def _pair_inputs(t, d, d2, dtype, seed, rope_half=8):
    """kv [t, d] and q_low [t, d2] as column views of one projection (the fused q_a + kv GEMM)."""
    x, weight, cos, sin = _inputs((t, d2 + d), rope_half, dtype=dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    weight2 = torch.rand(d2, generator=gen) + 0.5
    return x[:, d2:], weight[:d], cos, sin, x[:, :d2], weight2


def test_also_norm_reference_matches_the_formulas():
    kv, w, cos, sin, q_low, w2 = _pair_inputs(3, 24, 20, torch.float32, seed=2)
    y, y2 = rms_norm_rope(kv, 1e-6, w, cos, sin, impl="torch", also_norm=(q_low, w2))
    torch.testing.assert_close(y.double(), _loop(kv, 1e-6, w, cos, sin, False), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y2.double(), _loop(q_low, 1e-6, w2, None, None, False), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("d, d2", [(64, 48), (40, 96)])  # the wider row on either side, non-powers of two
def test_also_norm_kernel_matches_two_separate_norms(dtype, d, d2):
    kv, w, cos, sin, q_low, w2 = _pair_inputs(5, d, d2, dtype, seed=d2)
    w, w2 = w.to(dtype), w2.to(dtype)
    y, y2 = rms_norm_rope(kv, 1e-6, w, cos, sin, impl="triton", also_norm=(q_low, w2))
    assert y.shape == kv.shape and y2.shape == q_low.shape and y.dtype == y2.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(y, rms_norm_rope(kv, 1e-6, w, cos, sin, impl="torch"), **tol)
    torch.testing.assert_close(y2, rms_norm_rope(q_low, 1e-6, w2, impl="torch"), **tol)


def test_also_norm_packed_store_matches_the_reference():
    kv, w, cos, sin, q_low, w2 = _pair_inputs(6, 128, 96, torch.bfloat16, seed=5)
    rows = torch.tensor([7, 0, -1, 3, 2, 5])
    pools, norms = {}, {}
    for impl in ("torch", "triton"):
        pools[impl] = torch.zeros(8, 208, dtype=torch.uint8)
        _, norms[impl] = rms_norm_rope(kv, 1e-6, w.bfloat16(), cos, sin, impl=impl, pool=pools[impl], rows=rows,
                                       row_format="fp8_e8m0_b64_rope64", also_norm=(q_low, w2.bfloat16()))
    assert torch.equal(pools["torch"], pools["triton"]) and pools["torch"][7].any() and not pools["torch"][1].any()
    torch.testing.assert_close(norms["triton"], norms["torch"], rtol=8e-3, atol=8e-3)


def test_also_norm_bad_arguments_are_named():
    kv, w, cos, sin, q_low, w2 = _pair_inputs(3, 16, 8, torch.float32, seed=0)
    with pytest.raises(ValueError, match="also_norm needs"):
        rms_norm_rope(kv, 1e-6, None, cos, sin, also_norm=(q_low, w2))
    with pytest.raises(ValueError, match="also_norm must be"):
        rms_norm_rope(kv, 1e-6, w, cos, sin, also_norm=(q_low, w2[:4]))


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 8, 64])
@pytest.mark.parametrize("d2", [1024, 1536])  # Flash / Pro q_lora_rank beside the 512 kv latent
def test_also_norm_kernel_at_model_shapes_on_gpu(t, d2):
    kv, w, cos, sin, q_low, w2 = (a.cuda() for a in _pair_inputs(t, 512, d2, torch.bfloat16, seed=t, rope_half=32))
    w, w2 = w.bfloat16(), w2.bfloat16()
    y, y2 = rms_norm_rope(kv, 1e-6, w, cos, sin, impl="triton", also_norm=(q_low, w2))
    for got, want in ((y, rms_norm_rope(kv, 1e-6, w, cos, sin, impl="torch")),
                      (y2, rms_norm_rope(q_low, 1e-6, w2, impl="torch"))):
        torch.testing.assert_close(got.float(), want.float(), rtol=8e-3, atol=8e-3)
        assert (got != want).float().mean() < 0.01  # nearly all values bit-identical
