"""The decode columns op (window columns, then the top-k rows): the reference against the formula
written as a loop, the Triton kernel (interpreted on the CPU) against the reference, bad input."""

import pytest
import torch

from v4serve.ops.pick_columns import pick_columns


def _case(B, W, T, seed):
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(-1, 1000, (B, W), generator=g, dtype=torch.int32)
    rows_of = torch.randint(0, 5000, (B, T + 3), generator=g, dtype=torch.int32)[:, :T]  # a strided view
    scores = torch.randn(B, T, generator=g)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices  # int64, as the indexer's
    return prefix, rows_of, order


def test_reference_is_the_formula():
    prefix, rows_of, order = _case(2, 5, 9, seed=0)
    out = pick_columns(prefix, rows_of, order, 4, impl="torch")
    for b in range(2):
        want = prefix[b].tolist() + [int(rows_of[b, int(order[b, j])]) for j in range(4)]
        assert out[b].tolist() == want


@pytest.mark.parametrize("B, W, T, k", [(1, 8, 20, 8), (3, 5, 9, 9), (2, 7, 30, 0), (2, 0, 12, 5)])
def test_kernel_matches_the_reference(B, W, T, k):
    prefix, rows_of, order = _case(B, W, T, seed=B + W + T)
    order = order[:, :max(k, 1)]  # the indexer passes a [B, k] slice of the sort's [B, T]
    got = pick_columns(prefix, rows_of, order, k, impl="triton")
    want = pick_columns(prefix, rows_of, order, k, impl="torch")
    assert got.dtype == torch.int32 and got.shape == (B, W + k)
    assert torch.equal(got, want)


def test_bad_arguments_are_named():
    prefix, rows_of, order = _case(2, 4, 6, seed=1)
    with pytest.raises(ValueError, match="must be int32"):
        pick_columns(prefix.long(), rows_of, order, 3)
    with pytest.raises(ValueError, match="order >= k"):
        pick_columns(prefix, rows_of, order[:, :2], 3)


@pytest.mark.gpu
@pytest.mark.parametrize("B, T", [(1, 8192), (8, 32768)])
def test_kernel_at_model_shapes_on_gpu(B, T):
    prefix, rows_of, order = (t.cuda() for t in _case(B, 128, T, seed=B))
    order = order[:, :512]
    want = pick_columns(prefix, rows_of, order, 512, impl="torch")
    assert torch.equal(pick_columns(prefix, rows_of, order, 512), want)
