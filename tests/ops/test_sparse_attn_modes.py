"""Decode split widths of the sparse attention kernel against the fp32 torch reference.

CPU (interpreter): split widths that are not a multiple of the tile (the last tile of a split is
partly masked), holes, zero counts and a token whose columns are all holes. GPU (`pytest -m gpu`):
the split widths the tile sweep times (v4serve/bench/kernel_configs.py) at the DeepSeek-V4 shapes.
"""

import pytest
import torch
from cases import rel_err, sparse_attn_inputs

from v4serve.bench.shapes import WINDOW, sparse_decode_case
from v4serve.ops.sparse_attn import sparse_attn_paged
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

DECODE_SPLITS = {
    "48 columns in tiles of 32": dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=48, num_warps=4, num_stages=2),
    "96 columns in tiles of 32, 32 heads": dict(BLOCK_H=32, BLOCK_T=32, COLS_PER_SPLIT=96, num_warps=4, num_stages=2),
}


def _reference(q, win, cmp, idx, n_window, sink, scale, counts):
    return sparse_attn_paged(q.float(), win.float(), cmp.float(), idx, n_window, sink, scale, counts, impl="torch")


@pytest.mark.parametrize("mode", list(DECODE_SPLITS))
def test_decode_split_widths(mode):
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(3, 1, 40, 64, 20, 150, seed=11)
    counts[1] = 0
    idx[2, 0, :] = -1  # a token with no live column at all
    out = sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts, tile_config=DECODE_SPLITS[mode])
    assert rel_err(out, _reference(q, win, cmp, idx, 20, sink, 0.1, counts)) < 1.5e-2
    assert out[2].abs().max() == 0


GPU_DECODE = [
    dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=96, MERGE="kernel", PDL=True, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=128, MERGE="kernel", PDL=True, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_T=64, COLS_PER_SPLIT=128, MERGE="kernel", PDL=True, num_warps=4, num_stages=1),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", range(len(GPU_DECODE)))
@pytest.mark.parametrize("ratio", [4, 128, 0])
def test_decode_split_widths_full_dims(cfg, ratio):
    case = sparse_decode_case(ratio, 8, 32767, "cuda", seed=8 + ratio)
    out = torch.full_like(case.q, float("nan"))
    out.copy_(sparse_attn_paged_triton(*case.args(), tile_config=GPU_DECODE[cfg]))
    ref = _reference(case.q, case.win_pool, case.cmp_pool, case.idx, WINDOW, case.sink, case.scale, case.counts)
    assert not out.isnan().any() and rel_err(out, ref) < 1e-2
