"""The fp32 head over bf16 weights (ops/fp32_head.py) against fp32 arithmetic done independently:
float64 products of the exactly widened weights, rounded to fp32 once; both schedules (the FMA
decode rows and the ieee fp32 dot) under the interpreter, and the V4.1-Flash head on the GPU."""

import pytest
import torch

from v4serve.ops.fp32_head import fp32_head
from v4serve.ops.fp32_head_triton import fp32_head_triton


def _exact(x, w):
    return (x.double() @ w.double().T).float()


def _case(m, n, k, device="cpu", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(m, k, generator=g, device=device)
    w = (torch.randn(n, k, generator=g, device=device) * 0.05).to(torch.bfloat16)
    return x, w


@pytest.mark.parametrize("m", [1, 2, 3, 8, 9, 40])
def test_kernel_matches_fp32_arithmetic(m):
    # n, k not multiples of the tiles: the masks; m = 3 and 9 pad to 4 rows and to a 32-row dot tile
    x, w = _case(m, 100, 200, seed=m)
    got = fp32_head(x, w, impl="triton")
    want = _exact(x, w)
    assert got.dtype == torch.float32 and got.shape == (m, 100)
    # fp32 sums of 200 terms of |x w| ~ 0.05: a few ulps of the row's magnitude
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5 * want.abs().max().item())
    torch.testing.assert_close(fp32_head(x, w, impl="torch"), want, rtol=0, atol=2e-5 * want.abs().max().item())


def test_an_fp32_weight_is_read_as_it_is():
    x, w = _case(2, 48, 64)
    torch.testing.assert_close(fp32_head(x, w.float(), impl="triton"), _exact(x, w), rtol=0, atol=1e-5)


def test_bad_inputs_name_the_field():
    x, w = _case(1, 16, 32)
    with pytest.raises(ValueError, match="x must be fp32"):
        fp32_head(x.bfloat16(), w)
    with pytest.raises(ValueError, match="weight must be bf16 or fp32"):
        fp32_head(x, w[:, :16])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m,precision", [(1, "ieee"), (8, "ieee"), (64, "ieee"), (64, "tf32x3")])
def test_v41_flash_head_on_the_gpu(m, precision):
    x, w = _case(m, 129280, 4096, device="cuda", seed=m)
    got = fp32_head_triton(x, w, dot_precision=precision)
    want = _exact(x, w)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5 * want.abs().max().item())
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.99
