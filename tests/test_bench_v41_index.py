"""The V4.1 indexer's benchmark rows: the PR's 13 shape names, each with its H100 time, and the
case builder at a small size on the CPU (paged key rows, causal visibility, candidate lists)."""

import torch

from v4serve.bench.shapes import PR_NEW38_US, all_shapes
from v4serve.bench.v41_index_case import v41_index_case, v41_index_work


def test_the_prs_thirteen_shapes_are_rows_with_their_h100_times():
    rows = {n: spec for n, spec in all_shapes().items() if spec[0] == "v41_index"}
    assert len(rows) == 13 and all(n in PR_NEW38_US for n in rows)
    assert rows["full prefill n2048 start129024 r2"][1] == ("full", 1, 2048, 129024, 2, False)
    assert rows["cand decode B4 ctx131072 NC16384"][1] == ("cand", 4, 1, 131071, 1, False)


def test_cases_are_paged_causal_and_scored_by_the_op():
    case = v41_index_case("full", 1, 8, 20, 2, False, "cpu")
    assert case.key_rows.shape == (1, 14) and case.n_visible.tolist() == [[10, 11, 11, 12, 12, 13, 13, 14]]
    per_page = 64  # r2: a 128-token page holds 64 consecutive rows
    assert (case.key_rows[0, 1:] - case.key_rows[0, :-1] == 1).all() and int(case.key_rows[0, 0]) % per_page == 0
    nbytes, flops = v41_index_work(case)
    assert flops == 2 * 32 * 128 * int(case.n_visible.sum())
    assert nbytes == case.q.numel() * 2 + case.w.numel() * 2 + 14 * (68 + 4) + 8 * 14 * 2
    out = case.run()
    assert out.shape == (1, 8, 14) and torch.isneginf(out[0, 0, 10:]).all() and torch.isfinite(out[0, -1]).all()

    cand = v41_index_case("cand", 2, 1, 40, 1, False, "cpu")  # 41 rows: 6 blocks, all candidates
    assert cand.cand_blocks.shape == (2, 1, 2048)
    assert cand.cand_blocks[:, 0, :6].tolist() == [list(range(6))] * 2 and (cand.cand_blocks[..., 6:] == -1).all()
    assert torch.isfinite(cand.run()[..., :41]).all()
