"""V4.1 indexer ops (ops/v41_index.py) against a brute-force Python oracle: bf16 score rounding,
candidate blocks (block max, newest block pinned, top blocks), sorted top-k with -1 padding."""

import random

import torch

from v4serve.ops.v41_index import candidate_mask, index_scores_v41, select_sorted


def _bf16(v: float) -> float:
    return torch.tensor(v, dtype=torch.float32).to(torch.bfloat16).item()


def test_scores_round_like_the_reference_at_every_step():
    g = torch.Generator().manual_seed(0)
    S, H, D, N = 5, 3, 8, 11
    q = torch.randn(S, H, D, generator=g).to(torch.bfloat16)
    w = torch.randn(S, H, generator=g).to(torch.bfloat16)
    pool = torch.randn(N, D, generator=g).to(torch.bfloat16)
    rows = torch.tensor([3, 0, 7, -1, 10, 2], dtype=torch.int32)
    visible = torch.tensor([0, 2, 4, 5, 6], dtype=torch.int32)
    got = index_scores_v41(q, w, pool[rows.clamp(min=0).long()], rows >= 0, visible)
    per_query = index_scores_v41(q, w, pool[rows.clamp(min=0).long()].expand(S, -1, -1), (rows >= 0).expand(S, -1),
                                 visible)
    assert torch.equal(got, per_query)  # the decode form (each query its own keys) computes the same
    for s in range(S):
        for t in range(rows.shape[0]):
            if t >= visible[s] or rows[t] < 0:
                assert got[s, t] == float("-inf")
                continue
            total = 0.0
            for h in range(H):
                dot = _bf16(sum(float(a) * float(b) for a, b in zip(q[s, h].tolist(), pool[rows[t]].tolist())))
                total += _bf16(max(dot, 0.0) * float(w[s, h]))
            assert got[s, t].item() == _bf16(total)


def _oracle_candidates(scores, nvis, block, n_blocks):
    T = len(scores)
    blocks = [max(scores[j:j + block]) for j in range(0, T, block)]
    if nvis:
        blocks[(nvis - 1) // block] = float("inf")
    ranked = sorted(range(len(blocks)), key=lambda j: -blocks[j])[:n_blocks]
    keep = {j for j in ranked if blocks[j] != float("-inf")}
    return [t // block in keep for t in range(T)]


def test_candidate_mask_matches_the_oracle():
    rnd = random.Random(1)
    for _ in range(50):
        T, block, n_blocks = rnd.randint(1, 40), rnd.choice([2, 4, 8]), rnd.randint(1, 6)
        nvis = rnd.randint(0, T)
        scores = [rnd.choice([rnd.uniform(-3, 3), 0.0]) if t < nvis else float("-inf") for t in range(T)]
        got = candidate_mask(torch.tensor([scores]), torch.tensor([nvis]), block, n_blocks)[0].tolist()
        assert got == _oracle_candidates(scores, nvis, block, n_blocks)


def test_select_sorted_pads_and_sorts():
    rnd = random.Random(2)
    for _ in range(50):
        T, k = rnd.randint(1, 30), rnd.randint(1, 12)
        nvis = rnd.randint(0, T)
        values = rnd.sample(range(1000), T)  # distinct: no ties
        scores = [float(v) if t < nvis else float("-inf") for t, v in enumerate(values)]
        got = select_sorted(torch.tensor([scores]), k, torch.tensor([nvis]))[0].tolist()
        best = sorted(sorted(range(nvis), key=lambda t: -scores[t])[:k])
        assert got == best + [-1] * (k - len(best))
