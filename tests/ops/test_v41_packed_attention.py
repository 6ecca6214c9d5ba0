"""Sparse attention over DeepSeek-V4.1's two packed row formats on the Triton route (interpreted on
the CPU; the GPU test below at the model's shapes): window rows
fp8_e8m0_b32 and compressed rows fp4_e4m3_b16, each pool its own row stride, both views at a row
offset. The route unpacks the rows a step reads (decode: each token's columns; prefill: each
referenced row once) and runs the bf16 kernels, so its output must have the bits of the bf16
launch over the decoded pools, and the torch reference's values up to fp32 summation order."""

from __future__ import annotations

import pytest
import torch

from cases import rel_err, sparse_attn_inputs
from v4serve.formats import row_format
from v4serve.ops.kv_pack import pack_rows, unpack_rows
from v4serve.ops.sparse_attn import sparse_attn_paged
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

WIN, CMP = row_format("fp8_e8m0_b32"), row_format("fp4_e4m3_b16")


def _pool_view(values: torch.Tensor, fmt, offset: int) -> torch.Tensor:
    """The packed rows of `values` as a view `offset` rows into a larger, 16-byte-row buffer."""
    packed = pack_rows(values, fmt, impl="torch")
    buf = torch.zeros(offset + packed.shape[0] + 2, packed.shape[1], dtype=torch.uint8)
    buf[offset: offset + packed.shape[0]] = packed
    return buf[offset: offset + packed.shape[0]]


def _inputs(B, M, H, D, n_window, K, seed):
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(B, M, H, D, n_window, K, seed=seed)
    pw, pc = _pool_view(win, WIN, 3), _pool_view(cmp, CMP, 5)
    assert pw.stride(0) != pc.stride(0)  # two row strides: 144 and 80 bytes at D 128
    return q, pw, pc, idx, sink, counts


def _decoded(pool, fmt, D):
    return unpack_rows(pool, fmt, D, torch.bfloat16, impl="torch")


@pytest.mark.parametrize("B, M", [(1, 1), (3, 1), (2, 5)])  # split-K decode, two-pass decode, prefill
def test_two_formats_route_is_the_bf16_launch_over_the_decoded_pools(B, M):
    D, H, n_window, K = 128, 16, 16, 24
    q, pw, pc, idx, sink, counts = _inputs(B, M, H, D, n_window, K, seed=B * 10 + M)
    uw, uc = _decoded(pw, WIN, D), _decoded(pc, CMP, D)
    bound = None if M == 1 else B * M * (n_window + K)
    got = sparse_attn_paged(q, pw, pc, idx, n_window, sink, 0.1, counts, row_format=WIN.name,
                            cmp_row_format=CMP.name, impl="triton", unpack_bound=bound)
    bf16 = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 0.1, counts)
    assert torch.equal(got.view(torch.int16), bf16.view(torch.int16)) and bf16.abs().amax() > 0
    ref = sparse_attn_paged(q, pw, pc, idx, n_window, sink, 0.1, counts, row_format=WIN.name,
                            cmp_row_format=CMP.name, impl="torch")
    assert rel_err(got, ref) < 1e-2


def test_compaction_route_at_decode_is_the_bf16_launch_too():
    """The sweep's alternative decode route (every referenced row unpacked once, bound from the shapes)."""
    from v4serve.ops.sparse_attn_triton import sparse_attn_two_formats_triton

    D, H, n_window, K = 128, 16, 16, 24
    q, pw, pc, idx, sink, counts = _inputs(3, 1, H, D, n_window, K, seed=5)
    got = sparse_attn_two_formats_triton(q, pw, pc, idx, n_window, sink, 0.1, counts, WIN, CMP, route="compact")
    bf16 = sparse_attn_paged_triton(q, _decoded(pw, WIN, D), _decoded(pc, CMP, D), idx, n_window, sink, 0.1, counts)
    assert torch.equal(got.view(torch.int16), bf16.view(torch.int16))


@pytest.mark.parametrize("max_rows", [None, 9])
def test_compaction_of_two_formats_matches_the_reference(max_rows):
    """Every used row unpacked once, in pool order, each in its pool's format; a bound under the used
    count (9) drops the rows past it in kernel and reference alike."""
    from v4serve.ops.kv_compact import unpack_referenced_rows
    from v4serve.ops.kv_compact_reference import live_column_mask

    D = 128
    _, pw, pc, idx, _, counts = _inputs(2, 4, 1, D, 8, 12, seed=7)
    cols, counts = idx.reshape(8, -1), counts.reshape(8)
    want_rows, want_cols = unpack_referenced_rows(pw, pc, cols, 8, WIN, D, counts=counts, max_rows=max_rows,
                                                  impl="torch", cmp_fmt=CMP)
    rows, out_cols = unpack_referenced_rows(pw, pc, cols, 8, WIN, D, counts=counts, max_rows=max_rows,
                                            impl="triton", cmp_fmt=CMP)
    assert torch.equal(out_cols, want_cols)
    g = torch.where(torch.arange(cols.shape[1]) < 8, cols, cols + pw.shape[0])
    used = int(torch.unique(g[live_column_mask(cols, 8, counts)]).numel())
    kept = min(used, max_rows or used)
    assert used > 9 and torch.equal(rows[:kept].view(torch.int16), want_rows[:kept].view(torch.int16))
    # each live column reads the value of the row it named, decoded in its pool's format
    live = want_cols >= 0
    full = torch.cat((_decoded(pw, WIN, D), _decoded(pc, CMP, D)))
    assert torch.equal(want_rows[want_cols[live].long()].view(torch.int16), full[g[live].long()].view(torch.int16))


def test_per_column_unpack_of_two_formats():
    """Decode's per-column unpack: row t * C + c holds the decoded row column c names, -1 columns
    (holes and the columns past counts) stay holes."""
    from v4serve.ops.sparse_attn_unpacked_decode import unpack_columns

    D = 128
    _, pw, pc, idx, _, counts = _inputs(3, 1, 1, D, 16, 9, seed=11)
    it, ct = idx.reshape(3, -1), counts.reshape(3)
    rows, cols = unpack_columns(pw, pc, it, ct, 16, D, True, WIN, CMP)
    c = torch.arange(it.shape[1])
    live = (it >= 0) & (c[None, :] < 16 + ct[:, None])
    slots = (torch.arange(3)[:, None] * it.shape[1] + c)[live].int()
    assert torch.equal(cols >= 0, live) and torch.equal(cols[live], slots)
    uw, uc = _decoded(pw, WIN, D), _decoded(pc, CMP, D)
    rows_named = it.clamp(min=0).long()
    want = torch.where((c < 16)[None, :, None], uw[rows_named], uc[rows_named.clamp(max=uc.shape[0] - 1)])
    assert torch.equal(rows.view(3, -1, D)[live].view(torch.int16), want[live].view(torch.int16))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("B, M", [(1, 1), (8, 1), (64, 1), (1, 300)])
def test_two_formats_route_at_the_model_shapes(B, M):
    """V4.1-Flash attention (64 heads of 512, 128 window + 512 compressed columns) on the GPU: the
    bits of the bf16 launch over the decoded pools; the reference's values within bf16 rounding."""
    D, H, n_window, K = 512, 64, 128, 512
    q, pw, pc, idx, sink, counts = (t.cuda() for t in _inputs(B, M, H, D, n_window, K, seed=B + M))
    uw, uc = _decoded(pw, WIN, D), _decoded(pc, CMP, D)
    got = sparse_attn_paged(q, pw, pc, idx, n_window, sink, D**-0.5, counts, row_format=WIN.name,
                            cmp_row_format=CMP.name, unpack_bound=None if M == 1 else B * M * (n_window + K))
    bf16 = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, D**-0.5, counts)
    assert torch.equal(got.view(torch.int16), bf16.view(torch.int16))
    ref = sparse_attn_paged(q, pw, pc, idx, n_window, sink, D**-0.5, counts, row_format=WIN.name,
                            cmp_row_format=CMP.name, impl="torch")
    assert rel_err(got, ref) < 1e-2
