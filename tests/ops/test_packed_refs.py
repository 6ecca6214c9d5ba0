"""The torch paths over packed pools: attention, indexer scores, and the fused packed writes equal
the same ops over the unpacked (dequantized) bf16 rows / followed by pack_rows."""

import torch
from cases import sparse_attn_inputs

from v4serve.ops.indexer import index_scores
from v4serve.ops.kv_pack import pack_rows, unpack_rows
from v4serve.ops.kv_quant import hadamard
from v4serve.ops.norm_rope import rms_norm_rope
from v4serve.ops.sparse_attn import sparse_attn_paged


def test_sparse_attn_reference_over_packed_rows():
    fmt = "fp8_e8m0_b64_rope64"
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(2, 3, 8, 128, 10, 12, seed=1)
    pw, pc = pack_rows(win, fmt), pack_rows(cmp, fmt)
    out = sparse_attn_paged(q, pw, pc, idx, 10, sink, 0.1, counts, row_format=fmt, impl="torch")
    ref = sparse_attn_paged(q, unpack_rows(pw, fmt, 128), unpack_rows(pc, fmt, 128), idx, 10, sink, 0.1, counts,
                            impl="torch")
    assert torch.equal(out, ref)
    plain = sparse_attn_paged(q, win, cmp, idx, 10, sink, 0.1, counts, impl="torch")
    assert not torch.equal(out, plain)  # the packed rows really are the rounded ones


def test_index_scores_reference_over_packed_keys():
    g = torch.Generator().manual_seed(2)
    B, S, H, Dk, N, T = 2, 3, 4, 128, 20, 9
    q = torch.randn(B, S, H, Dk, generator=g).bfloat16()
    w = torch.randn(B, S, H, generator=g)
    keys = hadamard(torch.randn(N, Dk, generator=g).bfloat16())
    packed = pack_rows(keys, "fp4_e8m0_b32")
    rows = torch.randint(-1, N, (B, T), generator=g).to(torch.int32)
    vis = torch.randint(0, T + 1, (B, S), generator=g).to(torch.int32)
    out = index_scores(q, w, packed, rows, vis, row_format="fp4_e8m0_b32", impl="torch")
    ref = index_scores(q, w, unpack_rows(packed, "fp4_e8m0_b32", Dk), rows, vis, impl="torch")
    assert torch.equal(out, ref)


def test_norm_rope_packed_store_equals_pack_of_output():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 128, generator=g).bfloat16()
    wgt = torch.randn(128, generator=g).bfloat16()
    cos, sin = torch.randn(5, 32, generator=g), torch.randn(5, 32, generator=g)
    pool = torch.zeros(9, 208, dtype=torch.uint8)
    rows = torch.tensor([3, 0, -1, 8, 5])
    y = rms_norm_rope(x, 1e-6, wgt, cos, sin, impl="torch", pool=pool, rows=rows, row_format="fp8_e8m0_b64_rope64")
    packed = pack_rows(y, "fp8_e8m0_b64_rope64")
    assert torch.equal(pool[[3, 0, 8, 5]], packed[[0, 1, 3, 4]])
    assert not pool[[1, 2, 4, 6, 7]].any()
