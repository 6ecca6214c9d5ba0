"""V4.1 indexer kernels (ops/v41_index_triton.py, under the interpreter on the CPU) against the torch
reference (ops/v41_index_reference.py), and the device-side selection against the reference masks:
full and candidate mode, packed and bf16 keys, holes, empty rows, non-power-of-two sizes."""

import pytest
import torch

from v4serve.ops.v41_index import candidate_blocks, select_candidates, v41_index_scores
from v4serve.ops.v41_index_reference import candidate_mask, index_scores_v41, select_sorted

from v41_index_cases import head_sum_bound, index_inputs

TILES_TEST = dict(BLOCK_S=16, BLOCK_T=16, num_warps=4, num_stages=1)
ROWS_TEST = dict(BLOCK_T=32, num_warps=4, num_stages=1)
STREAM_TEST = dict(BLOCK_T=16, TILES=2, num_warps=4, num_stages=1)  # 16 slots a tile, 2 tiles a program
VARIANTS = {  # kernel, config
    "tiles": ("tiles", TILES_TEST),
    "rows": ("rows", ROWS_TEST),
    "stream": ("stream", STREAM_TEST),
    # the whole chain after griddepcontrol.wait (production issues its first stages before it; without
    # PDL both are orders of the same loads)
    "stream_late_chain": ("stream", dict(STREAM_TEST, EARLY_CHAIN=False)),
    # session 12's epilogue: the liveness select before one store (production: two disjointly masked stores)
    "stream_select_store": ("stream", dict(STREAM_TEST, SPLIT_STORE=False)),
}


def _reference(q, w, keys, rows, n_visible, allowed=None):
    """fp32 [B, S, R] from the reference, one sequence at a time."""
    out = []
    for b in range(q.shape[0]):
        k = keys[rows[b].clamp(min=0).long()]
        out.append(index_scores_v41(q[b], w[b], k, rows[b] >= 0, n_visible[b],
                                    None if allowed is None else allowed[b]))
    return torch.stack(out)


def _triton(*args, kernel, config=None, **kw):
    from v4serve.ops.v41_index_triton import v41_index_scores_triton

    return v41_index_scores_triton(*args, kernel=kernel, config=config, **kw)


@pytest.mark.parametrize("variant,packed", [("tiles", True), ("rows", True), ("stream", True), ("tiles", False),
                                            ("rows", False), ("stream", False), ("stream_late_chain", True),
                                            ("stream_select_store", True)])
def test_full_mode_gives_the_reference_bits_when_every_sum_is_exact(variant, packed):
    B, S, H, D, R = 2, 11, 3, 64, 37
    q, w, pool, keys, rows = index_inputs(B, S, H, D, R, 50, exact=True, seed=1)
    n_visible = torch.randint(0, R + 1, (B, S), generator=torch.Generator().manual_seed(2)).to(torch.int32)
    n_visible[0, 0], n_visible[1, -1] = 0, R  # an empty row and a full one
    kernel, cfg = VARIANTS[variant]
    got = _triton(q, w, pool if packed else keys, rows, n_visible, packed, kernel=kernel, config=cfg)
    want = _reference(q, w, keys, rows, n_visible)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got.float(), want)
    assert torch.isneginf(got[0, 0]).all()


@pytest.mark.parametrize("kernel", ["tiles", "rows", "stream"])
def test_full_mode_within_the_head_sum_bound_on_model_like_inputs(kernel):
    B, S, H, D, R = 1, 17, 8, 128, 23
    q, w, pool, keys, rows = index_inputs(B, S, H, D, R, 40, exact=False, seed=3)
    n_visible = torch.arange(R - S + 1, R + 1, dtype=torch.int32)[None]  # a causal prefill chunk
    got = _triton(q, w, pool, rows, n_visible, True, kernel=kernel, config=VARIANTS[kernel][1]).float()
    want = _reference(q, w, keys, rows, n_visible)
    finite = torch.isfinite(want)
    assert torch.equal(torch.isfinite(got), finite)
    ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp(min=2.0**-126))) - 7)
    bound = ulp + head_sum_bound(q, w, keys, rows, n_visible)
    assert ((got - want).abs()[finite] <= bound[finite]).all()
    assert (got == want)[finite].float().mean() > 0.9


def test_stream_kernel_reads_two_scale_words_per_row_at_256_channels():
    """D = 256: 32 code words and 2 scale words a row (code word i's scale in word 32 + i // 16). Model-
    like keys (8 different group scales a row) and two heads (a sum of two terms: any order, same bits)."""
    B, S, H, D, R = 1, 2, 2, 256, 21
    q, w, pool, keys, rows = index_inputs(B, S, H, D, R, 30, exact=False, seed=11)
    n_visible = torch.tensor([[R, 9]], dtype=torch.int32)
    got = _triton(q, w, pool, rows, n_visible, True, kernel="stream", config=STREAM_TEST)
    assert torch.equal(got.float(), _reference(q, w, keys, rows, n_visible))


def test_decode_form_and_the_dispatch():
    """S = 1 per sequence (a decode step): the dispatch's torch and Triton paths agree bit for bit."""
    B, H, D, R = 3, 5, 32, 29
    q, w, pool, keys, rows = index_inputs(B, 1, H, D, R, 64, exact=True, seed=4)
    n_visible = torch.tensor([[R], [0], [11]], dtype=torch.int32)
    a = v41_index_scores(q, w, pool, rows, n_visible, row_format="fp4_e8m0_b32", impl="torch")
    b = v41_index_scores(q, w, pool, rows, n_visible, row_format="fp4_e8m0_b32", impl="triton")
    c = v41_index_scores(q, w, keys, rows, n_visible, impl="triton")
    assert torch.equal(a, b) and torch.equal(b, c)
    assert torch.equal(a.float(), _reference(q, w, keys, rows, n_visible))


def _cand_blocks(B, S, NB, n_blocks_total, g):
    """Ascending block ids per query with -1 gaps at the end and some ids past the visible rows."""
    ids = torch.stack([torch.stack([torch.randperm(n_blocks_total, generator=g)[:NB].sort().values
                                    for _ in range(S)]) for _ in range(B)])
    drop = torch.arange(NB)[None, None, :] >= torch.randint(1, NB + 1, (B, S, 1), generator=g)
    return torch.where(drop, -1, ids).to(torch.int32)


@pytest.mark.parametrize("packed", [True, False])
def test_candidate_mode_scores_the_candidates_columns(packed):
    """Slot c of a query scores column blocks[c // 8] * 8 + c % 8 exactly as full mode scores that
    column (the reference), and -inf for empty slots, holes and columns past n_visible."""
    B, S, H, D, R, block = 2, 3, 4, 64, 45, 8  # 6 blocks, the last one partial
    q, w, pool, keys, rows = index_inputs(B, S, H, D, R, 60, exact=True, seed=5)
    g = torch.Generator().manual_seed(6)
    n_visible = torch.randint(1, R + 1, (B, S), generator=g).to(torch.int32)
    cands = _cand_blocks(B, S, 4, 6, g)
    cands[0, 0] = -1  # an empty list: the kernel writes -inf without reading a key
    for impl, kernel in (("torch", "auto"), ("triton", "rows"), ("triton", "rows_predecoded"), ("triton", "stream"),
                         ("triton", "stream_predecoded")):
        got = v41_index_scores(q, w, pool if packed else keys, rows, n_visible,
                               row_format="fp4_e8m0_b32" if packed else None, cand_blocks=cands, impl=impl,
                               kernel=kernel)
        full = _reference(q, w, keys, rows, n_visible)  # [B, S, R]
        cols = cands.long().repeat_interleave(block, -1) * block + torch.arange(4 * block) % block
        listed = cands.long().repeat_interleave(block, -1) >= 0
        want = torch.where(listed & (cols < R), full.gather(2, cols.clamp(0, R - 1)), float("-inf"))
        assert torch.equal(got.float(), want), (impl, kernel)


@pytest.mark.parametrize("kernel,early_chain,skip_by_list", [
    ("stream", False, True), ("stream", True, True), ("stream", True, False), ("stream_predecoded", False, True)])
def test_streamed_candidate_tiles_skip_empty_tiles_and_rounds_every_product(kernel, early_chain, skip_by_list):
    """Several tiles per program (the loop's prefetch stages), whole tiles of empty slots (skipped),
    an odd head count (weights padded to words), and two weighted heads per query: the score is then
    the sum of two products, the same fp32 sum in any order, so the logit and product roundings show
    in the bits on model-like inputs (a product left unrounded would round twice)."""
    B, S, H, D, R, block = 2, 3, 5, 64, 61, 8
    q, w, pool, keys, rows = index_inputs(B, S, H, D, R, 80, exact=False, seed=9)
    g = torch.Generator().manual_seed(10)
    two_heads = torch.rand(B, S, H, generator=g).argsort(-1) < 2
    w = torch.where(two_heads, torch.randn(B, S, H, generator=g).bfloat16(), torch.zeros((), dtype=torch.bfloat16))
    n_visible = torch.randint(1, R + 1, (B, S), generator=g).to(torch.int32)
    cands = torch.nn.functional.pad(_cand_blocks(B, S, 8, 8, g), (0, 4), value=-1)  # >= 2 empty tiles a query
    from v4serve.ops.v41_index_triton import _key_pool_words
    from v4serve.ops.v41_index_stream_triton import v41_stream_scores

    out = torch.empty(B, S, 12 * block, dtype=torch.bfloat16)
    got = v41_stream_scores(q, w, _key_pool_words(pool, True, D), rows, n_visible, True, cands, block, out,
                            dict(BLOCK_T=16, TILES=3, num_warps=4, num_stages=1, SKIP_BY_LIST=skip_by_list),
                            predecode=kernel == "stream_predecoded", skip_empty=True, early_chain=early_chain)
    full = _reference(q, w, keys, rows, n_visible)
    cols = cands.long().repeat_interleave(block, -1) * block + torch.arange(12 * block) % block
    listed = cands.long().repeat_interleave(block, -1) >= 0
    want = torch.where(listed & (cols < R), full.gather(2, cols.clamp(0, R - 1)), float("-inf"))
    assert torch.equal(got.float(), want)
    assert torch.isfinite(want).any() and torch.isneginf(want[..., -32:]).all()


def test_candidate_blocks_lists_the_reference_mask():
    g = torch.Generator().manual_seed(7)
    for T, block, n_blocks in ((37, 8, 3), (64, 8, 8), (9, 4, 1), (50, 8, 100)):
        S = 6
        n_visible = torch.randint(0, T + 1, (S,), generator=g).to(torch.int32)
        scores = torch.randn(S, T, generator=g).bfloat16().float()
        scores = scores.masked_fill(torch.arange(T)[None] >= n_visible[:, None].long(), float("-inf"))
        ids = candidate_blocks(scores.bfloat16(), n_visible, block, n_blocks)
        assert ids.shape == (S, min(n_blocks, -(-T // block)))
        mask = torch.zeros(S, -(-T // block) + 1, dtype=torch.bool)
        mask.scatter_(1, torch.where(ids >= 0, ids, mask.shape[1] - 1).long(), True)
        want = candidate_mask(scores, n_visible, block, n_blocks)
        assert torch.equal(mask[:, :-1].repeat_interleave(block, 1)[:, :T], want)
        kept = ids >= 0  # ascending, -1 only after the kept ones
        assert torch.equal(kept, kept.sort(dim=1, descending=True).values)
        assert (ids[:, 1:] > ids[:, :-1])[kept[:, 1:]].all()


def test_select_candidates_picks_what_select_sorted_picks_from_the_masked_scores():
    g = torch.Generator().manual_seed(8)
    S, T, block, k = 5, 70, 8, 12
    n_visible = torch.tensor([70, 33, 5, 0, 64], dtype=torch.int32)
    scores = torch.randperm(S * T, generator=g).view(S, T).float()  # distinct: no ties
    scores = scores.masked_fill(torch.arange(T)[None] >= n_visible[:, None].long(), float("-inf"))
    ids = candidate_blocks(scores, n_visible, block, 4)
    allowed = candidate_mask(scores, n_visible, block, 4)
    cols = ids.long().repeat_interleave(block, -1) * block + torch.arange(ids.shape[1] * block) % block
    slot_scores = torch.where((ids.long().repeat_interleave(block, -1) >= 0) & (cols < T),
                              scores.gather(1, cols.clamp(0, T - 1)), float("-inf"))
    got = select_candidates(slot_scores, ids, block, k, n_visible)
    want = select_sorted(scores.masked_fill(~allowed, float("-inf")), k, n_visible)
    assert torch.equal(got, want)


@pytest.mark.parametrize("candidates", [False, True])
def test_a_pool_without_rows_scores_minus_infinity(candidates):
    """Every key row a hole and the pool empty: -inf everywhere (the stream kernel reads pool row 0 for
    slots that are not live: the dispatch gives an empty pool a stand-in row)."""
    B, S, H, D, R = 2, 1, 2, 32, 16
    q, w, pool, _, _ = index_inputs(B, S, H, D, R, R, exact=True, seed=12)
    rows = torch.full((B, R), -1, dtype=torch.int32)
    n_visible = torch.full((B, S), R, dtype=torch.int32)
    cands = torch.tensor([0, 1], dtype=torch.int32).expand(B, S, 2).contiguous() if candidates else None
    for impl in ("torch", "triton"):
        got = v41_index_scores(q, w, pool[:0], rows, n_visible, row_format="fp4_e8m0_b32", cand_blocks=cands,
                               impl=impl, kernel="stream" if impl == "triton" else "auto")
        assert got.shape == (B, S, R) and torch.isneginf(got).all(), impl


def test_bad_inputs_are_named():
    q, w, pool, keys, rows = index_inputs(1, 2, 2, 32, 8, 10, exact=True)
    n_visible = torch.full((1, 2), 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="key_rows"):
        v41_index_scores(q, w, pool, rows.long(), n_visible, row_format="fp4_e8m0_b32")
    with pytest.raises(ValueError, match="k_pool"):
        v41_index_scores(q, w, pool[:, :10], rows, n_visible, row_format="fp4_e8m0_b32")
    with pytest.raises(ValueError, match="weights"):
        v41_index_scores(q, w[:, :1], pool, rows, n_visible, row_format="fp4_e8m0_b32")
