"""Full-shape kernel checks on the GPU (`pytest -m gpu tests/ops`): kernel vs torch reference."""

import pytest
import torch
from cases import rel_err, sparse_attn_inputs

from v4serve.bench.shapes import WINDOW, sparse_decode_case, sparse_prefill_case
from v4serve.ops.gated_pool import gated_pool
from v4serve.ops.indexer import index_scores
from v4serve.ops.kv_quant import apply_kv_format
from v4serve.ops.sparse_attn import sparse_attn_paged

pytestmark = pytest.mark.gpu


def _check_sparse(case, tol=1e-2):
    out = torch.full_like(case.q, float("nan"))
    out.copy_(sparse_attn_paged(*case.args(), impl="triton"))
    ref = sparse_attn_paged(case.q.float(), case.win_pool.float(), case.cmp_pool.float(), case.idx, WINDOW,
                            case.sink, case.scale, case.counts, impl="torch")
    assert not out.isnan().any() and rel_err(out, ref) < tol


@pytest.mark.parametrize("ratio,S,start", [(4, 512, 4096), (4, 256, 0), (128, 512, 8192), (0, 512, 0)])
def test_sparse_prefill_full_dims(ratio, S, start):
    _check_sparse(sparse_prefill_case(ratio, S, start, "cuda", seed=S + ratio))


@pytest.mark.parametrize("ratio", [4, 128, 0])
@pytest.mark.parametrize("B", [1, 8])
def test_sparse_decode_full_dims(ratio, B):
    _check_sparse(sparse_decode_case(ratio, B, 32767, "cuda", seed=B + ratio))


@pytest.mark.parametrize("H,M,n_window,K", [(20, 4, 100, 300), (16, 1, 50, 77), (128, 3, 128, 512), (128, 1, 128, 0)])
def test_sparse_attn_head_counts_and_widths(H, M, n_window, K):
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(2, M, H, 512, n_window, K, device="cuda", seed=H + K)
    out = sparse_attn_paged(q, win, cmp, idx, n_window, sink, 512**-0.5, counts, impl="triton")
    ref = sparse_attn_paged(q.float(), win.float(), cmp.float(), idx, n_window, sink, 512**-0.5, counts, impl="torch")
    assert rel_err(out, ref) < 1e-2


@pytest.mark.parametrize("B,R,D", [(1, 8, 512), (8, 128, 512), (1, 128, 128), (3, 129, 300), (2, 1, 64)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_gated_pool_full_shapes(B, R, D, out_dtype):
    kv = torch.randn(B, D, R, device="cuda").transpose(1, 2)
    score = torch.randn(B, R, D, device="cuda") * 3
    out = gated_pool(kv, score, out_dtype, impl="triton")
    ref = gated_pool(kv, score, out_dtype, impl="torch")
    torch.testing.assert_close(out, ref, rtol=2e-6 if out_dtype == torch.float32 else 8e-3, atol=1e-6)


def test_index_scores_prefill_shape():
    B, S, H, Dk, T = 1, 256, 64, 128, 2048
    q = torch.randn(B, S, H, Dk, device="cuda").bfloat16()
    w = torch.randn(B, S, H, device="cuda") * (128**-0.5 * 64**-0.5)
    k_pool = torch.randn(T + 64, Dk, device="cuda").bfloat16()
    key_rows = torch.randperm(T + 64, device="cuda")[:T].to(torch.int32)[None]
    n_visible = torch.arange(S, device="cuda", dtype=torch.int32)[None] * 8
    out = index_scores(q, w, k_pool, key_rows, n_visible, impl="triton")
    ref = index_scores(q.float(), w, k_pool.float(), key_rows, n_visible, impl="torch")
    finite = torch.isfinite(ref)
    assert torch.equal(torch.isfinite(out), finite) and rel_err(out[finite], ref[finite]) < 1e-5


@pytest.mark.parametrize("name,D", [("fp8_e8m0_b64_rope64", 512), ("fp8_e8m0_b32", 512), ("fp4_e8m0_b32", 128)])
def test_round_trips_bit_exact_on_gpu(name, D):
    x = (torch.randn(4096, D, device="cuda") * torch.logspace(-10, 6, 4096, device="cuda")[:, None]).bfloat16()
    out = apply_kv_format(x, name, impl="triton")
    assert torch.equal(out.view(torch.int16), apply_kv_format(x, name, impl="torch").view(torch.int16))
