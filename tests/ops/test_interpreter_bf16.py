"""The interpreter patch: bf16 arithmetic, casts and dots must match torch bit for bit (CPU only)."""

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU interpreter")


@triton.jit
def _bf16_ops_kernel(a_ptr, b_ptr, f_ptr, sum_ptr, prod_ptr, cast_ptr, dot_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    a, b, f = tl.load(a_ptr + i), tl.load(b_ptr + i), tl.load(f_ptr + i)
    tl.store(sum_ptr + i, a + b)
    tl.store(prod_ptr + i, a * b)
    tl.store(cast_ptr + i, f.to(tl.bfloat16))
    rows = tl.arange(0, 16)
    x = tl.load(a_ptr + rows[:, None] * 16 + rows[None, :])
    y = tl.load(b_ptr + rows[:, None] * 16 + rows[None, :])
    tl.store(dot_ptr + rows[:, None] * 16 + rows[None, :], tl.dot(x, y))


def test_bf16_ops_match_torch():
    n = 256
    a, b = torch.randn(n).bfloat16(), torch.randn(n).bfloat16()
    f = torch.randn(n)
    s, p, c = torch.empty_like(a), torch.empty_like(a), torch.empty_like(a)
    d = torch.empty(16, 16)
    _bf16_ops_kernel[(1,)](a, b, f, s, p, c, d, N=n)
    assert torch.equal(s, a + b) and torch.equal(p, a * b) and torch.equal(c, f.bfloat16())
    torch.testing.assert_close(d, a.view(16, 16).float() @ b.view(16, 16).float(), rtol=1e-6, atol=1e-5)
