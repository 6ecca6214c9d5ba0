"""Engram table lookup (ops/engram_lookup.py): the kernel (interpreted on the CPU) and the torch
reference against the formula (each code's e4m3 value times 2^(scale byte - 127)) written out
from float8 casts; every e4m3 code and several scales are covered; on the GPU, the kernel reads
a pinned host table in a captured CUDA graph."""

from __future__ import annotations

import pytest
import torch

from v4serve.ops.engram_lookup import engram_lookup


def _table(n: int, head_dim: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (n, head_dim), generator=g, dtype=torch.uint8)
    codes[0] = torch.arange(head_dim) % 128  # row 0: the positive codes in order
    codes[(codes & 0x7F) == 0x7F] = 0x01  # no NaN codes (a table holds finite values)
    scales = torch.randint(110, 135, (n, head_dim // 32), generator=g, dtype=torch.uint8)
    return codes.view(torch.float8_e4m3fn), scales


def _formula(table, scales, rows, dtype):
    values = table.float() * torch.exp2(scales.float() - 127).repeat_interleave(32, dim=1)
    return values[rows.flatten()].to(dtype).view(rows.shape[0], -1)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lookup_matches_the_formula(impl, dtype):
    table, scales = _table(300, 256, seed=1)
    table[1:2] = table[0:1].view(torch.uint8).add(128).view(torch.float8_e4m3fn)  # the other 128 codes
    rows = torch.tensor([[0, 1, 299], [5, 0, 0], [7, 250, 1]], dtype=torch.int64)  # 9 rows: not a multiple of 4
    got = engram_lookup(table, scales, rows, dtype, impl=impl)
    assert got.shape == (3, 3 * 256) and got.dtype == dtype
    assert torch.equal(got, _formula(table, scales, rows, dtype))


def test_an_empty_step_and_bad_tables():
    table, scales = _table(8, 64, seed=2)
    empty = engram_lookup(table, scales, torch.zeros(0, 3, dtype=torch.int64), torch.bfloat16, impl="triton")
    assert empty.shape == (0, 192)
    with pytest.raises(ValueError, match="table_scale"):
        engram_lookup(table, scales[:, :1], torch.zeros(1, 1, dtype=torch.int64), torch.bfloat16)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        engram_lookup(table.view(torch.uint8), scales, torch.zeros(1, 1, dtype=torch.int64), torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_kernel_reads_a_pinned_host_table_inside_a_cuda_graph():
    """V4.1-Flash's Engram shape (8 heads x 3 n-gram sizes = 24 rows of 256 codes per token) at c = 64."""
    table, scales = _table(1 << 20, 256, seed=3)
    table, scales = table.pin_memory(), scales.pin_memory()
    rows = torch.randint(0, 1 << 20, (64, 24), device="cuda")
    engram_lookup(table, scales, rows, torch.bfloat16)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = engram_lookup(table, scales, rows, torch.bfloat16)
    rows.copy_(torch.randint(0, 1 << 20, (64, 24), device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out.cpu(), _formula(table, scales, rows.cpu(), torch.bfloat16))
