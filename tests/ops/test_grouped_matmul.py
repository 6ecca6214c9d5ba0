"""MoE grouped matmul: the torch reference and the Triton kernel (interpreted on the CPU) against a
per-pick loop, with empty groups, uneven group sizes and K, N not multiples of the tiles."""

import pytest
import torch

from v4serve.ops.grouped_matmul import grouped_matmul


def _case(sizes, n, k, t=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(t, k, generator=gen)
    weight = torch.randn(len(sizes), n, k, generator=gen)
    rows = torch.randint(0, t, (sum(sizes),), generator=gen)
    ends = torch.tensor(sizes).cumsum(0).to(torch.int32)
    return x, weight, rows, ends


def _naive(x, weight, rows, ends):
    group = torch.searchsorted(ends.long(), torch.arange(rows.shape[0]), right=True)
    return torch.stack([weight[g] @ x[r] for g, r in zip(group.tolist(), rows.tolist())])


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("sizes, n, k", [([3, 0, 5, 1], 48, 64), ([0, 17, 0, 2, 40], 80, 96), ([1], 16, 32), ([0, 0, 33], 16, 32)])
def test_matches_a_loop_over_picks(impl, sizes, n, k):
    x, weight, rows, ends = _case(sizes, n, k)
    got = grouped_matmul(x, weight, rows, ends, impl=impl)
    torch.testing.assert_close(got, _naive(x, weight, rows, ends), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("sizes", [[3, 0, 5, 1, 20], [0, 0, 33]])
def test_without_rows_pick_m_is_row_m(impl, sizes):
    x, weight, _, ends = _case(sizes, 48, 64, t=sum(sizes))
    got = grouped_matmul(x, weight, None, ends, impl=impl)
    torch.testing.assert_close(got, _naive(x, weight, torch.arange(sum(sizes)), ends), rtol=1e-4, atol=1e-4)


def test_bad_arguments_are_named():
    x, weight, rows, ends = _case([2, 2], 16, 32)
    with pytest.raises(ValueError, match="ends must be int32"):
        grouped_matmul(x, weight, rows, ends.long())
    with pytest.raises(ValueError, match="weight"):
        grouped_matmul(x, weight[..., :16], rows, ends)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_on_gpu_at_flash_shapes():
    sizes = [0] * 250 + [3, 1, 7, 0, 2, 13]
    x, weight, rows, ends = _case(sizes, 512, 4096, t=64)
    x, weight, rows, ends = (t.cuda() for t in (x.bfloat16(), weight.bfloat16(), rows, ends))
    got = grouped_matmul(x, weight, rows, ends, impl="triton").float()
    want = _naive(x.float().cpu(), weight.float().cpu(), rows.cpu(), ends.cpu()).cuda()
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-1)
