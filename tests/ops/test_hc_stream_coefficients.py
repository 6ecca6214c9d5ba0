"""mHC coefficients from the streams in one launch (the mixer kernel with its coefficients epilogue),
interpreted on the CPU and at V4-Flash shapes on the GPU: bit for bit what the two kernels it
replaces (`hc_mix`, then `hc_coefficients`) compute from the same split of K, on the split path
(the last program of each token block runs the epilogue) and the unsplit one; and close to the
torch references (the mixer's fp32 sums run in another order)."""

import pytest
import torch

from v4serve.ops.hc_coefficients import hc_coefficients
from v4serve.ops.hc_mix_triton import hc_mix_triton, tile_config
from v4serve.ops.hc_stream_coefficients import hc_stream_coefficients

N, ITERS, HC_EPS, RMS_EPS = 4, 20, 1e-6, 1e-6


def _inputs(T, K, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K + 8, generator=g).bfloat16()[:, 3:K + 3]  # strided rows
    fn = torch.randn((2 + N) * N, K, generator=g) / K**0.5
    base = torch.randn((2 + N) * N, generator=g) * 0.5
    scale = torch.rand(3, generator=g) + 0.5
    return (t.to(device) for t in (x, fn, base, scale))


def _split(K, n_splits):
    k_per_split = 64 * -(-K // (64 * n_splits))
    return dict(BLOCK_T=16, BLOCK_K=64, num_warps=2, k_per_split=k_per_split, n_splits=-(-K // k_per_split))


def _two_kernels(x, fn, base, scale, config=None):
    mixes, row_scale = hc_mix_triton(x, fn, RMS_EPS, config=config)
    return hc_coefficients(mixes, row_scale, base, scale, N, ITERS, HC_EPS, impl="triton")


@pytest.mark.parametrize("T, n_splits", [(3, 3), (19, 1), (19, 7)])
def test_one_launch_matches_the_two_kernels_bit_for_bit(T, n_splits):
    x, fn, base, scale = _inputs(T, 400, seed=T * n_splits)
    cfg = _split(400, n_splits)
    coefficients = dict(base=base, scale=scale, n=N, iters=ITERS, hc_eps=HC_EPS)
    want = _two_kernels(x, fn, base, scale, cfg)
    for _ in range(2):  # twice: the split path must have reset its tickets
        got = hc_mix_triton(x, fn, RMS_EPS, config=cfg, coefficients=coefficients)[2:]
        for g, w in zip(got, want):
            assert torch.equal(g, w)


@pytest.mark.parametrize("T, coeff_t", [(1, 2), (5, 4), (19, 8)])
def test_epilogue_sub_blocks_give_the_same_bits(T, coeff_t):
    """The epilogue's token sub-block (COEFF_T: fewer tokens a thread at decode sizes) changes no bit:
    the Sinkhorn sums are fixed pairwise trees, whatever the tile."""
    x, fn, base, scale = _inputs(T, 256, seed=T + coeff_t)
    cfg = _split(256, 2)
    coefficients = dict(base=base, scale=scale, n=N, iters=ITERS, hc_eps=HC_EPS)
    want = hc_mix_triton(x, fn, RMS_EPS, config=dict(cfg, COEFF_T=16), coefficients=coefficients)
    got = hc_mix_triton(x, fn, RMS_EPS, config=dict(cfg, COEFF_T=coeff_t), coefficients=coefficients)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_op_matches_the_references():
    x, fn, base, scale = _inputs(5, 320, seed=11)
    got = hc_stream_coefficients(x, fn, RMS_EPS, base, scale, N, ITERS, HC_EPS, impl="triton")
    want = hc_stream_coefficients(x, fn, RMS_EPS, base, scale, N, ITERS, HC_EPS, impl="torch")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_bad_arguments_are_named():
    x, fn, base, scale = _inputs(2, 64, seed=0)
    with pytest.raises(ValueError, match="fn"):
        hc_stream_coefficients(x, fn[:, :63], RMS_EPS, base, scale, N, ITERS, HC_EPS)
    with pytest.raises(ValueError, match="base"):
        hc_stream_coefficients(x, fn, RMS_EPS, base[:23], scale, N, ITERS, HC_EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8])
def test_sub_blocks_and_splits_on_gpu(T):
    """Flash shapes: every COEFF_T the sweep times gives the production bits; other split counts (the
    sweep's 64 / 256 programs) move the mixes' fp32 sums only (tolerance of a reordered sum)."""
    x, fn, base, scale = _inputs(T, 4 * 4096, seed=T, device="cuda")
    coefficients = dict(base=base, scale=scale, n=N, iters=ITERS, hc_eps=HC_EPS)
    want = hc_mix_triton(x, fn, RMS_EPS, coefficients=coefficients)
    for coeff_t in (2, 8, 16):
        got = hc_mix_triton(x, fn, RMS_EPS, config=dict(tile_config(T, 4 * 4096), COEFF_T=coeff_t),
                            coefficients=coefficients)
        for g, w in zip(got, want):
            assert torch.equal(g, w)
    for programs in (64, 256):
        got = hc_mix_triton(x, fn, RMS_EPS, config=tile_config(T, 4 * 4096, programs), coefficients=coefficients)
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 64, 2048])
def test_one_launch_at_flash_shapes_on_gpu(T):
    """4 streams x 4096 channels, the production tiles of T (K split 128, 16, 2 and 2 ways)."""
    x, fn, base, scale = _inputs(T, 4 * 4096, seed=T, device="cuda")
    got = hc_stream_coefficients(x, fn, RMS_EPS, base, scale, N, ITERS, HC_EPS)
    for g, w in zip(got, _two_kernels(x, fn, base, scale)):
        assert torch.equal(g, w)
