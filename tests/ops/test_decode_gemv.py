"""The decode GEMV (the router's logits at decode): the Triton kernel (interpreted on the CPU)
against the torch reference (fp32 sums, one rounding; the kernel's sums run in another order),
with strided rows, partial blocks of N and K, and at the V4-Flash router's shape on the GPU."""

import pytest
import torch

from v4serve.ops.decode_gemv import decode_gemv


def _inputs(T, N, K, seed, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, K + 16, generator=g).bfloat16()[:, 8:K + 8]  # strided rows
    weight = (torch.randn(N, K, generator=g) * K**-0.5).bfloat16()
    return x.to(device), weight.to(device)


def _assert_matches_reference(x, weight):
    got = decode_gemv(x, weight, impl="triton")
    want = decode_gemv(x, weight, impl="torch")
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    # fp32 sums in another order, then one bf16 rounding: at most one bf16 ulp apart
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-3)


@pytest.mark.parametrize("T, N, K", [(1, 256, 1024), (3, 7, 600), (8, 33, 512)])
def test_kernel_matches_the_reference(T, N, K):
    _assert_matches_reference(*_inputs(T, N, K, seed=T * N))


def test_bad_arguments_are_named():
    x, weight = _inputs(9, 4, 64, seed=0)
    with pytest.raises(ValueError, match="at most 8 rows"):
        decode_gemv(x, weight)
    with pytest.raises(ValueError, match="one dtype"):
        decode_gemv(x[:2], weight.float())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("T", [1, 2, 8])
def test_flash_router_shape_on_gpu(T):
    _assert_matches_reference(*_inputs(T, 256, 4096, seed=T, device="cuda"))
