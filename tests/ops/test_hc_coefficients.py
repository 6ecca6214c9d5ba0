"""mHC coefficients: the torch reference against a per-token loop of the formulas, and the Triton
kernel (interpreted on the CPU) against the reference."""

import math

import pytest
import torch

from v4serve.ops.hc_coefficients import hc_coefficients


def _inputs(t, n=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mixes = torch.randn(t, (2 + n) * n, generator=gen) * 3
    row_scale = torch.rand(t, generator=gen) + 0.5
    base = torch.randn((2 + n) * n, generator=gen)
    scale = torch.rand(3, generator=gen) + 0.5
    return mixes, row_scale, base, scale


def _loop(mixes, row_scale, base, scale, n, iters, eps):
    pres, posts, combs = [], [], []
    for m_row, rs in zip(mixes.tolist(), row_scale.tolist()):
        m = [v * rs for v in m_row]
        pre = [1 / (1 + math.exp(-(scale[0] * m[j] + base[j]))) + eps for j in range(n)]
        post = [2 / (1 + math.exp(-(scale[1] * m[n + j] + base[n + j]))) for j in range(n)]
        c = [[scale[2] * m[2 * n + j * n + k] + base[2 * n + j * n + k] for k in range(n)] for j in range(n)]
        c = [[math.exp(v - max(r)) / sum(math.exp(u - max(r)) for u in r) + eps for v in r] for r in c]
        c = [[c[j][k] / (sum(c[i][k] for i in range(n)) + eps) for k in range(n)] for j in range(n)]
        for _ in range(iters - 1):
            c = [[v / (sum(r) + eps) for v in r] for r in c]
            c = [[c[j][k] / (sum(c[i][k] for i in range(n)) + eps) for k in range(n)] for j in range(n)]
        pres.append(pre), posts.append(post), combs.append(c)
    return (torch.tensor(pres, dtype=torch.float64), torch.tensor(posts, dtype=torch.float64),
            torch.tensor(combs, dtype=torch.float64))


@pytest.mark.parametrize("t", [1, 7, 33])
def test_reference_matches_the_formulas(t):
    args = _inputs(t)
    got = hc_coefficients(*args, n=4, iters=20, eps=1e-6, impl="torch")
    want = _loop(*args, n=4, iters=20, eps=1e-6)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-6)
    # The last Sinkhorn half-step normalises columns (rows converge only approximately in 20 rounds).
    torch.testing.assert_close(got[2].sum(-2), torch.ones(t, 4), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t, iters", [(1, 20), (45, 20), (64, 3)])
def test_triton_kernel_matches_the_reference(t, iters):
    args = _inputs(t, seed=t)
    want = hc_coefficients(*args, n=4, iters=iters, eps=1e-6, impl="torch")
    got = hc_coefficients(*args, n=4, iters=iters, eps=1e-6, impl="triton")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


def test_bad_arguments_are_named():
    mixes, row_scale, base, scale = _inputs(3)
    with pytest.raises(ValueError, match="mixes must be"):
        hc_coefficients(mixes[:, :-1], row_scale, base, scale, n=4, iters=20, eps=1e-6)
    with pytest.raises(ValueError, match="power of two"):
        hc_coefficients(mixes[:, :15], row_scale, base[:15], scale, n=3, iters=20, eps=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_kernel_on_gpu():
    args = [a.cuda() for a in _inputs(4096, seed=9)]
    want = hc_coefficients(*args, n=4, iters=20, eps=1e-6, impl="torch")
    got = hc_coefficients(*args, n=4, iters=20, eps=1e-6, impl="triton")
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
