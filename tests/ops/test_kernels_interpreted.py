"""Triton kernels against their torch references at small shapes (CPU: TRITON_INTERPRET=1).

bf16 attention and indexer kernels are compared with the fp32 reference on the same bf16 values
(bf16 rounding of P and O bounds the error near 1e-2 relative); the round trips must be bit-exact.
"""

import pytest
import torch
from cases import rel_err, sparse_attn_inputs

from v4serve.ops.gated_pool import gated_pool
from v4serve.ops.indexer import index_scores
from v4serve.ops.kv_quant import apply_kv_format
from v4serve.ops.sparse_attn import sparse_attn_paged

SPARSE_CASES = {
    # name: (B, M, H, D, n_window, K)
    "h20 prefill": (1, 3, 20, 64, 100, 37),
    "h16 decode": (2, 1, 16, 64, 50, 70),
    "h128 prefill": (1, 2, 128, 64, 8, 5),
    "h64 decode window 100 topk 100": (1, 1, 64, 64, 100, 100),
    "ratio 0 (window only)": (1, 3, 16, 64, 50, 0),
    "d 96 decode": (1, 1, 16, 96, 16, 17),
}


def _run(case, with_counts, seed=0):
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(*SPARSE_CASES[case], seed=seed)
    counts = counts if with_counts else None
    out = sparse_attn_paged(q, win, cmp, idx, SPARSE_CASES[case][4], sink, 0.1, counts, impl="triton")
    ref = sparse_attn_paged(q.float(), win.float(), cmp.float(), idx, SPARSE_CASES[case][4], sink, 0.1,
                            counts, impl="torch")
    return out, ref, idx


@pytest.mark.parametrize("case", list(SPARSE_CASES))
@pytest.mark.parametrize("with_counts", [False, True])
def test_sparse_attn_kernel_matches_reference(case, with_counts):
    out, ref, _ = _run(case, with_counts, seed=len(case))
    assert out.dtype == torch.bfloat16 and rel_err(out, ref) < 1.5e-2


def test_sparse_attn_kernel_zero_counts_and_all_holes():
    q, win, cmp, idx, sink, _ = sparse_attn_inputs(1, 2, 16, 64, 4, 9, seed=3)
    idx[0, 1] = -1
    zero = torch.zeros(1, 2, dtype=torch.int32)
    out = sparse_attn_paged(q, win, cmp, idx, 4, sink, 0.1, zero, impl="triton")
    ref = sparse_attn_paged(q.float(), win.float(), cmp.float(), idx, 4, sink, 0.1, zero, impl="torch")
    assert rel_err(out, ref) < 1.5e-2
    assert out[0, 1].abs().max() == 0


def test_sparse_attn_kernel_rejects_misaligned_pool():
    q, win, cmp, idx, sink, _ = sparse_attn_inputs(1, 2, 16, 64, 4, 4)
    flat = torch.zeros(1 + 64 * 10, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="win_pool must be 16-byte aligned"):
        sparse_attn_paged(q, flat[1:].view(10, 64), cmp, idx, 4, sink, 0.1, impl="triton")


@pytest.mark.parametrize("R", [1, 3, 5, 7, 9, 16, 127, 129])
@pytest.mark.parametrize("D,out_dtype", [(300, torch.float32), (100, torch.bfloat16), (64, torch.float32)])
def test_gated_pool_kernel_matches_reference(R, D, out_dtype):
    g = torch.Generator().manual_seed(R * D)
    kv = torch.randn(2, D, R, generator=g).transpose(1, 2)  # strided view
    score = torch.randn(3, R, D, generator=g)[1:] * 4
    if R > 1:
        score[0, 0, :7] = float("-inf")
    out = gated_pool(kv, score, out_dtype, impl="triton")
    ref = gated_pool(kv, score, out_dtype, impl="torch")
    assert out.dtype == out_dtype
    torch.testing.assert_close(out, ref, rtol=2e-6 if out_dtype == torch.float32 else 8e-3, atol=1e-6)


@pytest.mark.parametrize("B,S,H,Dk,T", [(2, 3, 20, 128, 70), (1, 4, 64, 64, 5), (1, 2, 16, 128, 129)])
def test_index_scores_kernel_matches_reference(B, S, H, Dk, T):
    g = torch.Generator().manual_seed(T)
    q = torch.randn(B, S, H, Dk, generator=g).bfloat16()
    weights, k_pool = torch.randn(B, S, H, generator=g), torch.randn(100, Dk, generator=g).bfloat16()[4:]
    key_rows = torch.randint(-1, 96, (B, T), generator=g).to(torch.int32)
    n_visible = torch.randint(0, T + 3, (B, S), generator=g).to(torch.int32)
    out = index_scores(q, weights, k_pool, key_rows, n_visible, impl="triton")
    ref = index_scores(q.float(), weights, k_pool.float(), key_rows, n_visible, impl="torch")
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite)
    assert rel_err(out[finite], ref[finite]) < 1e-5


@pytest.mark.parametrize("name,D", [("fp8_e8m0_b64_rope64", 512), ("fp8_e8m0_b32", 512), ("fp4_e8m0_b32", 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_round_trip_kernel_is_bit_exact(name, D, dtype):
    g = torch.Generator().manual_seed(D)
    x = (torch.randn(37, D, generator=g) * torch.logspace(-8, 4, 37)[:, None]).to(dtype)
    x[0] = 0.0
    x[1, :3] = -0.0
    out = apply_kv_format(x, name, impl="triton")
    ref = apply_kv_format(x, name, impl="torch")
    int_view = torch.int16 if dtype == torch.bfloat16 else torch.int32
    assert torch.equal(out.view(int_view), ref.view(int_view))


DECODE_MODES = {
    "single pass": dict(BLOCK_H=16, BLOCK_T=16, COLS_PER_SPLIT=None, num_warps=4, num_stages=1),
    "split + merge kernel": dict(BLOCK_H=16, BLOCK_T=16, COLS_PER_SPLIT=32, MERGE="kernel", num_warps=4, num_stages=1),
    "split + fused merge": dict(BLOCK_H=16, BLOCK_T=16, COLS_PER_SPLIT=32, MERGE="fused", num_warps=4, num_stages=1),
    "split + fused merge, 32 heads": dict(BLOCK_H=32, BLOCK_T=16, COLS_PER_SPLIT=48, MERGE="fused", num_warps=4,
                                          num_stages=1),
}


@pytest.mark.parametrize("mode", list(DECODE_MODES))
def test_sparse_decode_modes(mode):
    """Every decode path (one pass, split + merge kernel, split + fused last-program merge), twice in
    a row so the fused merge's tickets must have been reset, with holes and zero counts."""
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    q, win, cmp, idx, sink, counts = sparse_attn_inputs(3, 1, 40, 64, 20, 70, seed=7)
    counts[1] = 0
    for rep in range(2):
        out = sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts, tile_config=DECODE_MODES[mode])
        ref = sparse_attn_paged(q.float(), win.float(), cmp.float(), idx, 20, sink, 0.1, counts, impl="torch")
        assert rel_err(out, ref) < 1.5e-2, (mode, rep)
