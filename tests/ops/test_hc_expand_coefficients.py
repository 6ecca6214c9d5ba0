"""The mHC expand fused with the next sublayer's mixer and coefficients (one launch), interpreted
on the CPU and at V4-Flash shapes on the GPU: bit for bit the two launches it replaces (`hc_expand`,
then `hc_stream_coefficients` at the same tiles: both kernels add the streams in the same order and
the mixer sees the same rounded values in the same K blocks), on the split path (the last program of
each token block runs the epilogue) and the unsplit one; and close to the torch references."""

import pytest
import torch

from v4serve.ops.hc_expand import hc_expand
from v4serve.ops.hc_expand_coefficients import hc_expand_coefficients
from v4serve.ops.hc_expand_mix_triton import hc_expand_mix_triton
from v4serve.ops.hc_mix_triton import hc_mix_triton, tile_config

N, ITERS, HC_EPS, RMS_EPS = 4, 20, 1e-6, 1e-6


def _inputs(T, D, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    streams = torch.randn(T, N, D + 8, generator=g).bfloat16()[:, :, 2:D + 2]  # strided streams
    output = torch.randn(T, D, generator=g).bfloat16()
    post = 2 * torch.rand(T, N, generator=g)
    comb = torch.rand(T, N, N, generator=g)
    comb = comb / comb.sum(1, keepdim=True)
    fn = torch.randn((2 + N) * N, N * D, generator=g) / (N * D) ** 0.5
    base = torch.randn((2 + N) * N, generator=g) * 0.5
    scale = torch.rand(3, generator=g) + 0.5
    return [t.to(device) for t in (output, streams, post, comb, fn, base, scale)]


def _two_launches(output, streams, post, comb, fn, base, scale, config):
    new_streams = hc_expand(output, streams, post, comb, impl="triton")
    coefficients = dict(base=base, scale=scale, n=N, iters=ITERS, hc_eps=HC_EPS)
    return (new_streams, *hc_mix_triton(new_streams.flatten(1), fn, RMS_EPS, config=config,
                                        coefficients=coefficients)[2:])


@pytest.mark.parametrize("T, D, n_splits, coeff_t", [(3, 128, 3, 2), (17, 64, 1, 16), (17, 64, 5, 4)])
def test_one_launch_matches_the_two_kernels_bit_for_bit(T, D, n_splits, coeff_t):
    args = _inputs(T, D, seed=T * n_splits)
    k_per_split = 64 * -(-N * D // (64 * n_splits))
    cfg = dict(BLOCK_T=16, BLOCK_K=64, num_warps=2, k_per_split=k_per_split, n_splits=-(-N * D // k_per_split),
               COEFF_T=coeff_t)
    want = _two_launches(*args, cfg)
    coefficients = dict(base=args[5], scale=args[6], n=N, iters=ITERS, hc_eps=HC_EPS)
    for _ in range(2):  # twice: the split path must have reset its tickets
        got = hc_expand_mix_triton(*args[:5], RMS_EPS, coefficients, config=cfg)
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def test_op_matches_the_references():
    args = _inputs(5, 128, seed=7)
    got = hc_expand_coefficients(*args[:5], RMS_EPS, *args[5:], N, ITERS, HC_EPS, impl="triton")
    want = hc_expand_coefficients(*args[:5], RMS_EPS, *args[5:], N, ITERS, HC_EPS, impl="torch")
    torch.testing.assert_close(got[0].float(), want[0].float(), rtol=8e-3, atol=1e-2)  # bf16: one rounding apart
    for g, w in zip(got[1:], want[1:]):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-4)


def test_widths_the_kernel_does_not_take_run_the_two_ops():
    args = _inputs(2, 96, seed=3)  # 96 channels: a 64-wide K block would straddle two streams
    got = hc_expand_coefficients(*args[:5], RMS_EPS, *args[5:], N, ITERS, HC_EPS, impl="triton")
    want = _two_launches(*args, None)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_bad_arguments_are_named():
    output, streams, post, comb, fn, base, scale = _inputs(2, 64, seed=0)
    with pytest.raises(ValueError, match="post"):
        hc_expand_coefficients(output, streams, post[:, :3], comb, fn, RMS_EPS, base, scale, N, ITERS, HC_EPS)
    with pytest.raises(ValueError, match="fn"):
        hc_expand_coefficients(output, streams, post, comb, fn[:, :100], RMS_EPS, base, scale, N, ITERS, HC_EPS)


@pytest.mark.gpu
@pytest.mark.parametrize("T", [1, 8, 64])
def test_one_launch_at_flash_shapes_on_gpu(T):
    """4 streams x 4096 channels, the production tiles of T: the two launches' bits."""
    args = _inputs(T, 4096, seed=T, device="cuda")
    got = hc_expand_coefficients(*args[:5], RMS_EPS, *args[5:], N, ITERS, HC_EPS)
    for g, w in zip(got, _two_launches(*args, tile_config(T, N * 4096))):
        assert torch.equal(g, w)
