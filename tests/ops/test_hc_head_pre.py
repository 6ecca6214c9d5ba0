"""The mHC head's collapse weights in one launch (the mixer kernel with its HEAD_PRE epilogue),
interpreted on the CPU and at V4-Flash shapes on the GPU, against the torch reference (the head's
formula as the model wrote it before: mixer, then five elementwise ops). Tolerance: the mixer's fp32
sums run in another order than F.linear's (relative ~1e-6 of the mixes), and the kernel may fuse the
multiply and the add of base into one FMA; the sigmoid's slope (<= 1/4) only shrinks both."""

import pytest
import torch

from v4serve.ops.hc_head_pre import hc_head_pre
from v4serve.ops.hc_head_pre_reference import hc_head_pre_reference
from v4serve.ops.hc_mix_triton import hc_mix_triton

N, RMS_EPS, HC_EPS = 4, 1e-6, 1e-6


def _inputs(T, K, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K + 8, generator=g).bfloat16()[:, 5:K + 5]  # strided rows
    fn = torch.randn(N, K, generator=g) / K**0.5
    base = torch.randn(N, generator=g) * 0.5
    scale = torch.rand(1, generator=g) + 0.5
    return (t.to(device) for t in (x, fn, base, scale))


@pytest.mark.parametrize("T, config", [(3, None), (19, "one split"), (19, "three splits")])
def test_one_launch_matches_the_reference(T, config):
    x, fn, base, scale = _inputs(T, 384, seed=T)
    splits = {"one split": 1, "three splits": 3}
    head = dict(base=base, scale=scale, hc_eps=HC_EPS)
    want = hc_head_pre_reference(x, fn, RMS_EPS, base, scale, HC_EPS)
    if config is None:
        got = hc_head_pre(x, fn, RMS_EPS, base, scale, HC_EPS, impl="triton")
    else:
        cfg = dict(BLOCK_T=16, BLOCK_K=64, num_warps=2, k_per_split=384 // splits[config], n_splits=splits[config])
        got = hc_mix_triton(x, fn, RMS_EPS, config=cfg, head=head)[2]
    assert got.shape == (T, N) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert (got > HC_EPS).all() and (got < 1 + 2 * HC_EPS).all()


def test_bad_arguments_are_named():
    x, fn, base, scale = _inputs(2, 64, seed=0)
    with pytest.raises(ValueError, match="base"):
        hc_head_pre(x, fn, RMS_EPS, base[:3], scale, HC_EPS)
    with pytest.raises(ValueError, match="fn"):
        hc_head_pre(x, fn[:, :60], RMS_EPS, base, scale, HC_EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8])
def test_one_launch_at_flash_shapes_on_gpu(T):
    x, fn, base, scale = _inputs(T, 4 * 4096, seed=T, device="cuda")
    got = hc_head_pre(x, fn, RMS_EPS, base, scale, HC_EPS)
    torch.testing.assert_close(got, hc_head_pre_reference(x, fn, RMS_EPS, base, scale, HC_EPS), rtol=1e-5, atol=1e-6)
