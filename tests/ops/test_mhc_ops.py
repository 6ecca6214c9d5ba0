"""mHC mixer input, collapse and expand: Triton kernels (interpreted on the CPU) against their torch
references, with strided inputs, non-power-of-two widths, forced split-K configurations (run twice,
so the split kernel's tickets must have been reset), and at V4-Flash shapes on the GPU."""

import pytest
import torch

from v4serve.ops.hc_collapse import hc_collapse
from v4serve.ops.hc_expand import hc_expand
from v4serve.ops.hc_mix import hc_mix
from v4serve.ops.hc_mix_triton import hc_mix_triton
from v4serve.ops.norm_rope import rms_norm_rope


def _mix_inputs(T, K, M, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K + 8, generator=g).to(dtype)[:, 3:K + 3]  # strided rows
    fn = torch.randn(M, K, generator=g) / K**0.5
    return x.to(device), fn.to(device)


def _expand_inputs(T, n, D, dtype, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    streams = torch.randn(T, n, D, generator=g).to(dtype)
    output = torch.randn(T, D, generator=g).to(dtype)
    pre = torch.rand(T, n, generator=g) + 1e-6
    post = 2 * torch.rand(T, n, generator=g)
    comb = torch.rand(T, n, n, generator=g)
    comb = comb / comb.sum(1, keepdim=True)
    return (t.to(device) for t in (streams, output, pre, post, comb))


def _assert_mix_close(got, want):
    mixes, row_scale = got
    torch.testing.assert_close(mixes, want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(row_scale, want[1], rtol=1e-6, atol=0)


@pytest.mark.parametrize("T,K,M,dtype", [(1, 256, 24, torch.bfloat16), (5, 300, 24, torch.float32),
                                         (40, 384, 4, torch.bfloat16), (300, 128, 24, torch.bfloat16),
                                         (0, 64, 24, torch.bfloat16)])
def test_hc_mix_kernel_matches_reference(T, K, M, dtype):
    x, fn = _mix_inputs(T, K, M, dtype, seed=T + K)
    _assert_mix_close(hc_mix(x, fn, 1e-6, impl="triton"), hc_mix(x, fn, 1e-6, impl="torch"))


@pytest.mark.parametrize("n_splits", [1, 3, 7])
def test_hc_mix_split_k_is_reset_between_launches(n_splits):
    x, fn = _mix_inputs(19, 400, 24, torch.bfloat16, seed=n_splits)
    k_per_split = 64 * -(-400 // (64 * n_splits))
    cfg = dict(BLOCK_T=16, BLOCK_K=64, num_warps=4, k_per_split=k_per_split, n_splits=-(-400 // k_per_split))
    want = hc_mix(x, fn, 1e-6, impl="torch")
    for _ in range(2):
        _assert_mix_close(hc_mix_triton(x, fn, 1e-6, config=cfg), want)


@pytest.mark.parametrize("T,n,D", [(1, 4, 64), (3, 4, 700), (2, 2, 1030), (0, 4, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_hc_collapse_and_expand_kernels_match_reference(T, n, D, dtype):
    streams, output, pre, post, comb = _expand_inputs(T, n, D, dtype, seed=T * D)
    strided = torch.cat([streams, streams], dim=2)[:, :, D:]
    exact = dict(rtol=0, atol=0) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(hc_collapse(strided, pre, impl="triton"), hc_collapse(strided, pre, impl="torch"),
                               **exact)
    # bf16: the kernel rounds where the torch reference rounds, so the results are bit-identical.
    torch.testing.assert_close(hc_expand(output, strided, post, comb, impl="triton"),
                               hc_expand(output, strided, post, comb, impl="torch"), **exact)


@pytest.mark.parametrize("T,D", [(1, 4096), (3, 700)])
def test_hc_collapse_with_the_sublayer_norm_is_the_two_kernels_bit_for_bit(T, D):
    """The model's collapse + RMSNorm in one launch: the collapse kernel then the norm kernel's bits,
    and the references' within bf16 rounding."""
    streams, _, pre, _, _ = _expand_inputs(T, 4, D, torch.bfloat16, seed=T + D)
    weight = (torch.rand(D, generator=torch.Generator().manual_seed(D)) + 0.5).bfloat16()
    got = hc_collapse(streams, pre, weight, 1e-6, impl="triton")
    two_launches = rms_norm_rope(hc_collapse(streams, pre, impl="triton"), 1e-6, weight, impl="triton")
    assert torch.equal(got, two_launches)
    torch.testing.assert_close(got, hc_collapse(streams, pre, weight, 1e-6, impl="torch"), rtol=0, atol=0)


def test_bad_arguments_are_named():
    streams, output, pre, post, comb = _expand_inputs(2, 4, 8, torch.bfloat16, seed=0)
    with pytest.raises(ValueError, match="fn"):
        hc_mix(streams.flatten(1), torch.zeros(24, 31), 1e-6)
    with pytest.raises(ValueError, match="pre"):
        hc_collapse(streams, pre[:, :3])
    with pytest.raises(ValueError, match="norm_weight"):
        hc_collapse(streams, pre, torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="comb"):
        hc_expand(output, streams, post, comb[:, :3])
    with pytest.raises(ValueError, match="dtype"):
        hc_expand(output.float(), streams, post, comb)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 8, 64, 2048])
def test_mhc_kernels_at_flash_shapes(T):
    """V4-Flash: hidden 4096, 4 streams, fn [24, 16384]."""
    x, fn = _mix_inputs(T, 4 * 4096, 24, torch.bfloat16, seed=T, device="cuda")
    for _ in range(2):
        _assert_mix_close(hc_mix(x, fn, 1e-6, impl="triton"), hc_mix(x, fn, 1e-6, impl="torch"))
    streams, output, pre, post, comb = _expand_inputs(T, 4, 4096, torch.bfloat16, seed=T, device="cuda")
    got = hc_collapse(streams, pre, impl="triton").float()
    torch.testing.assert_close(got, hc_collapse(streams, pre, impl="torch").float(), rtol=8e-3, atol=1e-5)
    # Against the CPU reference, which rounds its bf16 mix once: cuBLAS may reduce it at lower
    # precision (the H200 run against the CUDA reference differed by up to 1 ulp at |x| in [4, 8)).
    got = hc_expand(output, streams, post, comb, impl="triton").float().cpu()
    want = hc_expand(*(t.cpu() for t in (output, streams, post, comb)), impl="torch").float()
    torch.testing.assert_close(got, want, rtol=8e-3, atol=4e-2)
    weight = torch.rand(4096, device="cuda").bfloat16() + 0.5
    two_launches = rms_norm_rope(hc_collapse(streams, pre, impl="triton"), 1e-6, weight, impl="triton")
    assert torch.equal(hc_collapse(streams, pre, weight, 1e-6, impl="triton"), two_launches)
