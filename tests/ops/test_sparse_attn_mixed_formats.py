"""Sparse attention over window rows and compressed rows of two packed formats (DeepSeek-V4.1:
fp8_e8m0_b32 window, fp4_e4m3_b16 compressed) equals attention over the decoded values."""

import torch

from v4serve.ops.kv_pack import pack_rows, unpack_rows
from v4serve.ops.sparse_attn import sparse_attn_paged


def test_two_formats_equal_the_decoded_rows():
    g = torch.Generator().manual_seed(3)
    B, M, H, D, W, K = 2, 3, 4, 128, 5, 7
    q = torch.randn(B, M, H, D, generator=g).to(torch.bfloat16)
    win = torch.randn(20, D, generator=g).to(torch.bfloat16)
    cmp = torch.randn(13, D, generator=g).to(torch.bfloat16)
    win_p, cmp_p = pack_rows(win, "fp8_e8m0_b32", impl="torch"), pack_rows(cmp, "fp4_e4m3_b16", impl="torch")
    idx = torch.cat((torch.randint(-1, 20, (B, M, W), generator=g), torch.randint(-1, 13, (B, M, K), generator=g)), -1)
    idx = idx.to(torch.int32)
    sink = torch.randn(H, generator=g)
    got = sparse_attn_paged(q, win_p, cmp_p, idx, W, sink, D**-0.5, row_format="fp8_e8m0_b32",
                            cmp_row_format="fp4_e4m3_b16", impl="torch")
    want = sparse_attn_paged(q, unpack_rows(win_p, "fp8_e8m0_b32", D, torch.bfloat16, impl="torch"),
                             unpack_rows(cmp_p, "fp4_e4m3_b16", D, torch.bfloat16, impl="torch"), idx, W, sink,
                             D**-0.5, impl="torch")
    assert torch.equal(got, want)
    # one packed, one plain pool
    plain = unpack_rows(cmp_p, "fp4_e4m3_b16", D, torch.bfloat16, impl="torch")
    mixed = sparse_attn_paged(q, win_p, plain, idx, W, sink, D**-0.5, row_format="fp8_e8m0_b32",
                              cmp_row_format=None, impl="torch")
    assert torch.equal(mixed, want)
