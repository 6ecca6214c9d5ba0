"""V4.1 indexer kernels on the GPU at the PR's 13 shapes (`pytest -m gpu tests/ops/test_v41_index_gpu.py`).

The bench cases (v4serve/bench/v41_index_case.py: paged packed fp4 pool, 32 heads x 128) against
the torch reference (v41_index_reference.py) on a sample of queries (the reference materialises
[S, H, R] logits): within the head-sum bound of v41_index_triton.py and mostly bit-equal on the
model-like inputs, bit-equal on exact-sum inputs (tests/ops/v41_index_cases.py) where every order
agrees; candidate mode equal to full mode's scores at the candidates' columns; the whole selection
(scores, candidate blocks, top-k) captured in a CUDA graph (no host sync) and picking what the
reference picks.
"""

import pytest
import torch

from v4serve.bench.v41_index_case import CAND_BLOCK, CAND_BLOCKS, ROW_FORMAT, v41_index_case, v41_index_shapes
from v4serve.ops.kv_pack import pack_rows, unpack_rows
from v4serve.ops.kv_quant import apply_kv_format
from v4serve.ops.v41_index import candidate_blocks, select_candidates, select_sorted
from v4serve.ops.v41_index_reference import candidate_mask, index_scores_v41

from v41_index_cases import _grid_values, head_sum_bound

pytestmark = pytest.mark.gpu

SHAPES = v41_index_shapes()
ELEMENTS = 1 << 27  # reference logits budget: S_sample * H * R


def _sample(S, H, R, g):
    n = max(1, min(S, ELEMENTS // (H * R)))
    picks = torch.randperm(S, generator=g)[:n]
    return torch.unique(torch.cat([picks, torch.tensor([0, S - 1])])).cuda()


def _reference_full(case, b, sub):
    keys = unpack_rows(case.pool[case.key_rows[b].clamp(min=0).long()], ROW_FORMAT, case.q.shape[-1])
    ref = index_scores_v41(case.q[b, sub], case.w[b, sub], keys, case.key_rows[b] >= 0, case.n_visible[b, sub])
    return ref, keys


def _exact_inputs(case, g):
    """The case's pool, q and w replaced by exact-sum values (v41_index_cases.py)."""
    B, S, H, D = case.q.shape
    case.q = _grid_values((B, S, H, D), g).bfloat16().cuda()
    case.pool = pack_rows(_grid_values((case.pool.shape[0], D), g).bfloat16().cuda(), ROW_FORMAT)
    e = torch.randint(-2, 3, (B, S, H), generator=g).float()
    case.w = (torch.exp2(e) * torch.where(torch.rand(B, S, H, generator=g) < 0.3, -1.0, 1.0)).bfloat16().cuda()
    return case


@pytest.mark.parametrize("name", [n for n in SHAPES if n.startswith("full")])
@pytest.mark.parametrize("exact", [False, True])
def test_full_mode_at_the_pr_shapes(name, exact):
    _, args = SHAPES[name]
    g = torch.Generator().manual_seed(len(name))
    case = v41_index_case(*args, device="cuda", seed=len(name))
    if exact:
        case = _exact_inputs(case, g)
    got = case.run().float()
    B, S, H, _ = case.q.shape
    for b in range(B):
        sub = _sample(S, H, case.key_rows.shape[1], g)
        want, keys = _reference_full(case, b, sub)
        mine = got[b, sub]
        finite = torch.isfinite(want)
        assert torch.equal(torch.isfinite(mine), finite), name
        if exact:
            assert torch.equal(mine, want), name
            continue
        ulp = torch.exp2(torch.floor(torch.log2(want.abs().clamp(min=2.0**-126))) - 7)
        columns = torch.arange(keys.shape[0], dtype=torch.int32, device="cuda")[None]  # keys are gathered
        bound = ulp + head_sum_bound(case.q[b:b + 1, sub], case.w[b:b + 1, sub], keys, columns,
                                     case.n_visible[b:b + 1, sub])[0]
        assert ((mine - want).abs()[finite] <= bound[finite]).all(), name
        assert (mine == want)[finite].float().mean() > 0.95, name


@pytest.mark.parametrize("name", ["full prefill n2048 start0 r2", "full prefill n128 start8064 r1"])
def test_tiles_and_rows_kernels_agree_on_exact_inputs(name):
    case = _exact_inputs(v41_index_case(*SHAPES[name][1], device="cuda"), torch.Generator().manual_seed(1))
    assert torch.equal(case.run(kernel="tiles"), case.run(kernel="rows"))


@pytest.mark.parametrize("name", ["cand prefill n128 start130944 NC16384", "cand decode B4 ctx131072 NC16384"])
def test_predecoded_candidates_equal_in_kernel_decoding(name):
    """The keys decoded once (bf16 rows) give the scores of decoding them per query, bit for bit."""
    case = v41_index_case(*SHAPES[name][1], device="cuda", seed=4)
    assert torch.equal(case.run(kernel="rows"), case.run(kernel="rows_predecoded"))


@pytest.mark.parametrize("name", ["full decode B1 ctx131072 r1 staged1M", "cand decode B4 ctx131072 NC16384",
                                  "cand prefill n128 start8064 NC16384"])
def test_every_swept_variant_gives_the_production_bits_on_exact_inputs(name):
    """The sweep's launches at this shape (bench/v41_index_configs.py: session 12's production, the trigger,
    the split store and the list's empty-tile test each alone, the chain before griddepcontrol.wait,
    programs per SM, register caps) against production, where every summation order gives the same bits."""
    from v4serve.bench.v41_index_configs import SHAPES as SWEPT
    from v4serve.bench.v41_index_configs import _launch

    case = _exact_inputs(v41_index_case(*SHAPES[name][1], device="cuda"), torch.Generator().manual_seed(5))
    want = case.run()
    for kernel, config in [c for c in SWEPT[name] if c is not None]:
        if kernel.endswith("predecoded") and case.cand_blocks is None:
            continue
        assert torch.equal(_launch(case, kernel, config), want), (name, kernel, config)


@pytest.mark.parametrize("name", ["cand decode B1 ctx131072 NC16384", "full decode B1 ctx32768 r2 staged1M"])
def test_early_chain_scores_the_q_and_w_written_by_the_kernel_launched_right_before(name):
    """Production (EARLY_CHAIN) loads the candidate list, key_rows and n_visible before griddepcontrol.wait
    and q, w and the key words after it: with q and w rewritten by the kernel launched right before
    each call (a copy, then the PDL launch), the scores are those of the new q and w, bit for bit the
    launch with the whole chain after the wait. A q or w load hoisted above the wait would read the
    old values."""
    from v4serve.bench.v41_index_configs import _launch
    from v4serve.ops.v41_index_stream_triton import STREAM_CONFIG

    case = v41_index_case(*SHAPES[name][1], device="cuda", seed=7)
    g = torch.Generator(device="cuda").manual_seed(7)
    for _ in range(4):
        q = apply_kv_format(torch.randn(case.q.shape, generator=g, device="cuda").bfloat16(), ROW_FORMAT)
        w = (torch.randn(case.w.shape, generator=g, device="cuda") * 0.03).bfloat16()
        case.q.copy_(q)
        case.w.copy_(w)  # the last kernel before the launch
        got = case.run()
        assert torch.equal(got, _launch(case, "stream", dict(STREAM_CONFIG, EARLY_CHAIN=False))), name


@pytest.mark.parametrize("name", ["full decode B1 ctx32768 r2 staged1M", "cand decode B4 ctx131072 NC16384",
                                  "cand prefill n128 start130944 NC16384"])
def test_products_are_rounded_once_each_with_two_weighted_heads(name):
    """Model-like q and keys, two heads weighted per query: the score is the sum of two bf16 products,
    the same fp32 sum in any order, so it must equal the reference bit for bit (a logit or product
    left unrounded, e.g. a bf16 multiply contracted into the sum, would differ)."""
    g = torch.Generator().manual_seed(6)
    case = v41_index_case(*SHAPES[name][1], device="cuda", seed=6)
    B, S, H, _ = case.q.shape
    two = (torch.rand(B, S, H, generator=g).argsort(-1) < 2).cuda()
    case.w = torch.where(two, torch.randn(B, S, H, generator=g).cuda().bfloat16(), 0.0).bfloat16()
    got = case.run().float()
    blocks, case.cand_blocks = case.cand_blocks, None
    for b in range(B):
        sub = _sample(S, H, case.key_rows.shape[1], g)
        want, _ = _reference_full(case, b, sub)
        if blocks is not None:  # the candidates' columns of the full-mode reference
            listed = blocks[b, sub].long().repeat_interleave(CAND_BLOCK, -1)
            cols = listed * CAND_BLOCK + torch.arange(listed.shape[-1], device="cuda") % CAND_BLOCK
            R = want.shape[-1]
            want = torch.where((listed >= 0) & (cols < R), want.gather(1, cols.clamp(0, R - 1)), float("-inf"))
        assert torch.equal(got[b, sub], want), name


@pytest.mark.parametrize("name", [n for n in SHAPES if n.startswith("cand")])
def test_candidate_mode_equals_full_mode_at_the_candidates(name):
    case = _exact_inputs(v41_index_case(*SHAPES[name][1], device="cuda"), torch.Generator().manual_seed(2))
    got = case.run()
    blocks, case.cand_blocks = case.cand_blocks, None
    full = case.run(kernel="rows")
    R = full.shape[2]
    listed = blocks.long().repeat_interleave(CAND_BLOCK, -1)
    cols = listed * CAND_BLOCK + torch.arange(CAND_BLOCKS * CAND_BLOCK, device="cuda") % CAND_BLOCK
    want = torch.where((listed >= 0) & (cols < R), full.gather(2, cols.clamp(0, R - 1)), float("-inf"))
    assert torch.equal(got, want.bfloat16())


def _selection(case, k=512):
    """Scores -> candidate blocks -> a Reindex layer's top-k (one sequence): the device path."""
    scores = case.run()[0]
    n_visible = case.n_visible[0]
    blocks = candidate_blocks(scores, n_visible, CAND_BLOCK, CAND_BLOCKS)
    blocks = torch.nn.functional.pad(blocks, (0, CAND_BLOCKS - blocks.shape[1]), value=-1)
    full_picks = select_sorted(scores, k, n_visible)
    case.cand_blocks = blocks[None]
    cand_scores = case.run()[0]
    case.cand_blocks = None
    return full_picks, blocks, select_candidates(cand_scores, blocks, CAND_BLOCK, k, n_visible)


def test_selection_is_graph_safe_and_picks_what_the_reference_picks():
    """Decoder shape (r1, 17,000 rows: more than 2048 blocks, so the candidates restrict)."""
    case = _exact_inputs(v41_index_case("full", 1, 4, 17000, 1, False, device="cuda", seed=3),
                         torch.Generator().manual_seed(3))
    full_picks, blocks, picks = _selection(case)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _selection(case)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(out, (full_picks, blocks, picks)))
    ref_scores, _ = _reference_full(case, 0, torch.arange(4, device="cuda"))
    allowed = candidate_mask(ref_scores, case.n_visible[0], CAND_BLOCK, CAND_BLOCKS)
    want = select_sorted(ref_scores.masked_fill(~allowed, float("-inf")), 512, case.n_visible[0])
    for s in range(4):  # the same scores picked (ties may pick other columns of equal score)
        mine = ref_scores[s, picks[s][picks[s] >= 0].long()].sort().values
        theirs = ref_scores[s, want[s][want[s] >= 0].long()].sort().values
        assert torch.equal(mine, theirs)
