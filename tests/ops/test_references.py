"""The torch references against the float64 loop oracles of naive.py (small random inputs)."""

import pytest
import torch
from naive import (
    E2M1_GRID,
    E4M3_GRID,
    naive_block_round_trip,
    naive_gated_pool,
    naive_index_scores,
    naive_sparse_attn,
    sylvester_hadamard,
)

from v4serve.ops.gated_pool import gated_pool
from v4serve.ops.indexer import index_scores, select_topk
from v4serve.ops.kv_quant import apply_kv_format, hadamard
from v4serve.ops.sparse_attn import sparse_attn_paged


def _rel_err(out, ref):
    return float((out.double() - ref).norm() / ref.norm().clamp(min=1e-30))


def _random_idx(B, M, n_window, K, n_win_rows, n_cmp_rows, hole_fraction=0.3):
    win = torch.randint(0, max(1, n_win_rows), (B, M, n_window), dtype=torch.int32)
    cmp = torch.randint(0, max(1, n_cmp_rows), (B, M, K), dtype=torch.int32)
    idx = torch.cat([win, cmp], -1)
    return torch.where(torch.rand(idx.shape) < hole_fraction, -1, idx).to(torch.int32)


@pytest.mark.parametrize("B,M,H,D,n_window,K", [(2, 3, 4, 16, 5, 7), (1, 4, 3, 24, 0, 9), (2, 2, 2, 8, 6, 0)])
@pytest.mark.parametrize("with_counts", [False, True])
def test_sparse_attn_reference_matches_loops(B, M, H, D, n_window, K, with_counts):
    torch.manual_seed(B * 100 + D + K)
    base = torch.randn(40, D)
    win_pool, cmp_pool = base[3:20], base[20:37]  # views with a row offset
    q = torch.randn(B, M, H, D)
    idx = _random_idx(B, M, n_window, K, 17, 17)
    idx[0, 0] = -1  # a query with nothing live
    sink = torch.randn(H)
    counts = torch.randint(0, K + 1, (B, M), dtype=torch.int32) if with_counts else None
    out = sparse_attn_paged(q, win_pool, cmp_pool, idx, n_window, sink, 0.3, counts, impl="torch")
    ref = naive_sparse_attn(q, win_pool, cmp_pool, idx, n_window, sink, 0.3, counts)
    assert out.dtype == q.dtype and _rel_err(out, ref) < 1e-5
    assert out[0, 0].abs().max() == 0


def test_sparse_attn_reference_empty_compressed_pool():
    q, win_pool = torch.randn(1, 2, 2, 8), torch.randn(4, 8)
    idx = torch.tensor([[[0, 1, -1, -1], [2, 3, -1, -1]]], dtype=torch.int32)
    out = sparse_attn_paged(q, win_pool, win_pool[:0], idx, 2, torch.zeros(2), 0.5, impl="torch")
    ref = naive_sparse_attn(q, win_pool, win_pool[:0], idx, 2, torch.zeros(2), 0.5)
    assert _rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("B,R,D", [(1, 1, 5), (2, 3, 7), (3, 8, 16), (1, 9, 3)])
def test_gated_pool_reference_matches_loops(B, R, D):
    torch.manual_seed(R * 10 + D)
    kv = torch.randn(B, D, R).transpose(1, 2)  # strided
    score = torch.randn(B, R, D) * 3
    score[0, 0, 0] = float("-inf")
    if R > 1:
        out = gated_pool(kv, score, impl="torch")
        assert _rel_err(out, naive_gated_pool(kv, score)) < 1e-5
    assert gated_pool(kv, score, torch.bfloat16, impl="torch").dtype == torch.bfloat16


@pytest.mark.parametrize("B,S,H,Dk,T", [(2, 3, 4, 16, 11), (1, 5, 3, 8, 1), (1, 2, 2, 8, 0)])
def test_index_scores_reference_matches_loops(B, S, H, Dk, T):
    torch.manual_seed(S * 7 + T)
    q, weights, k_pool = torch.randn(B, S, H, Dk), torch.randn(B, S, H), torch.randn(30, Dk)[2:]
    key_rows = torch.randint(-1, 28, (B, T), dtype=torch.int32)
    n_visible = torch.randint(0, T + 2, (B, S), dtype=torch.int32)
    out = index_scores(q, weights, k_pool, key_rows, n_visible, impl="torch")
    ref = naive_index_scores(q, weights, k_pool, key_rows, n_visible)
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite)
    assert torch.allclose(out[finite].double(), ref[finite], rtol=1e-5, atol=1e-5)


def test_select_topk_pads_and_marks_masked_picks():
    scores = torch.tensor([[[0.5, float("-inf"), 2.0, 1.0]]])
    assert select_topk(scores, 3).tolist() == [[[2, 3, 0]]]
    assert select_topk(scores, 6).tolist() == [[[2, 3, 0, -1, -1, -1]]]
    scores[0, 0, :] = float("-inf")
    assert select_topk(scores, 2).tolist() == [[[-1, -1]]]


def _quant_input(rows, dim):
    x = torch.randn(rows, dim) * torch.logspace(-6, 3, rows)[:, None]
    x[0, :32] = torch.tensor(E2M1_GRID[1:] * 4 + [0.0] * 4) * 0.25 + 0.125  # ties between grid points
    x[1, :] = 0.0
    return x


@pytest.mark.parametrize(
    "name,block,n_quant,grid,qmax,floor,kind",
    [
        ("fp8_e8m0_b64_rope64", 64, 448, E4M3_GRID, 448.0, 1e-4, "ue8m0"),
        ("fp8_e8m0_b32", 32, 512, E4M3_GRID, 448.0, 1e-4, "ue8m0"),
        ("fp4_e8m0_b32", 32, 128, E2M1_GRID, 6.0, 6.0 * 2.0**-126, "ue8m0"),
        ("fp4_e4m3_b16", 16, 512, E2M1_GRID, 6.0, 6.0 * 2.0**-9, "e4m3"),
    ],
)
def test_round_trips_match_grid_search(name, block, n_quant, grid, qmax, floor, kind):
    torch.manual_seed(block + n_quant)
    x = _quant_input(6, 128 if name == "fp4_e8m0_b32" else 512)
    out = apply_kv_format(x, name, impl="torch")
    ref = naive_block_round_trip(x, block, n_quant, grid, qmax, floor, kind)
    assert torch.equal(out.double(), ref)
    xb = x.bfloat16()
    assert torch.equal(apply_kv_format(xb, name, impl="torch")[..., n_quant:], xb[..., n_quant:])


def test_hadamard_matches_sylvester_matrix():
    x = torch.randn(3, 5, 64)
    assert _rel_err(hadamard(x), x.double() @ sylvester_hadamard(64)) < 1e-6
    with pytest.raises(ValueError, match="power-of-two"):
        hadamard(torch.randn(2, 48))
