"""The indexer's top-k kernel (ops/index_topk_triton.py, interpreted on the CPU) against the stable
descending torch.sort (ops/index_topk_reference.py): the same columns in the same order and the same
value bits, over ties, all-equal rows, -inf masks, -0.0 beside +0.0, k = T, T not a power of two,
both schedules (one launch; split + merge) and short loop steps; the dispatch (`sorted_top`,
`select_topk`) and its marks; a GPU test at the decode / verify shapes, in a CUDA graph."""

import pytest
import torch

from v4serve.bench.index_topk_configs import SHAPES, topk_case, topk_runner
from v4serve.ops.index_topk_reference import index_topk_reference
from v4serve.ops.index_topk_triton import index_topk_triton, topk_splits
from v4serve.ops.indexer import select_topk, sorted_top

NEG_INF = float("-inf")


def _scores(kind: str, B: int, T: int, seed: int, device="cpu") -> torch.Tensor:
    """fp32 [B, T] score rows of one kind (all of them the shapes the indexer produces: finite or -inf)."""
    g = torch.Generator().manual_seed(seed)
    if kind == "randn":
        s = torch.randn(B, T, generator=g)
    elif kind == "ties":  # few distinct values: long runs of equal scores, zeros of both signs
        s = torch.randint(-2, 3, (B, T), generator=g).float() * 0.5
        s = torch.where(torch.rand(B, T, generator=g) < 0.3, -0.0, s)
    elif kind == "equal":  # every score of a row equal
        s = torch.full((B, T), 0.25)
        s[0] = 0.0
    elif kind == "masked":  # visible prefixes of different lengths (0 .. T), -inf past them
        s = torch.randint(-3, 4, (B, T), generator=g).float()
        visible = torch.randint(0, T + 1, (B,), generator=g)
        visible[0] = 0
        s = torch.where(torch.arange(T)[None] < visible[:, None], s, NEG_INF)
    elif kind == "holes":  # -inf scattered (holes in the key rows) among ties
        s = torch.randint(0, 3, (B, T), generator=g).float()
        s = torch.where(torch.rand(B, T, generator=g) < 0.4, NEG_INF, s)
    elif kind == "extremes":  # the float range's ends: largest finite, smallest subnormals, signs
        vals = torch.tensor([3.4028235e38, -3.4028235e38, 1e-45, -1e-45, 1.1754944e-38, -0.0, 0.0, 1.0, -1.0,
                             2.0, -2.0, NEG_INF])
        s = vals[torch.randint(0, len(vals), (B, T), generator=g)]
    else:
        raise ValueError(kind)
    return s.to(device)


def _same(got, want):
    """Columns equal, values equal bit for bit (-0.0 is not +0.0)."""
    (gv, gc), (wv, wc) = got, want
    assert gc.dtype == torch.int64 and gc.shape == wc.shape
    assert torch.equal(gc, wc)
    assert torch.equal(gv.view(torch.int32), wv.view(torch.int32))


KINDS = ("randn", "ties", "equal", "masked", "holes", "extremes")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("B, T, k, splits, block", [
    (3, 37, 5, 1, 256),        # T < one loop step, not a power of two
    (2, 300, 17, 1, 256),      # two loop steps, the second partial
    (1, 1000, 40, 3, 256),     # split: three chunks of 512, 512, ... (last one short)
    (2, 300, 70, 4, 256),      # split: a 44-column chunk, shorter than k, keeps all of its columns
    (2, 50, 50, 1, 256),       # k = T
    (1, 9, 1, 1, 256),         # k = 1
])
def test_kernel_is_the_stable_sort(kind, B, T, k, splits, block):
    s = _scores(kind, B, T, seed=B * 1000 + T + k)
    _same(index_topk_triton(s, k, splits=splits, block=block), index_topk_reference(s, k))


@pytest.mark.parametrize("kind", ("ties", "masked", "extremes"))
@pytest.mark.parametrize("B, T, k", [(2, 37, 5), (2, 100, 100), (1, 130, 64)])
def test_sort_all_variant_is_the_stable_sort(kind, B, T, k):
    """The sort-everything schedule (short rows: every key sorted, no select; production up to
    SORT_ALL_RULE_COLUMNS)."""
    s = _scores(kind, B, T, seed=T + k)
    _same(index_topk_triton(s, k, sort_all=True), index_topk_reference(s, k))


def _live_rows(kind: str, T: int, live: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One row per live count: scores of `kind` below it, -inf from it on (a decode step's rows)."""
    n_live = torch.tensor(live, dtype=torch.int32)
    s = _scores(kind, len(live), T, seed=seed)
    return torch.where(torch.arange(T)[None] < n_live[:, None], s, NEG_INF), n_live


LIVE_BOUND_CASES = [
    (300, 17, 1, 64),    # one launch: prefixes up to 64 sorted whole, longer ones selected
    (300, 17, 3, 64),    # split: chunks past the prefix write padding only, the merge as before
    (700, 40, 1, 256),   # 256 sort lanes (~20 s a kind interpreted: ties and extremes only)
    (1000, 40, 4, 64),   # split in 4 chunks of 256: the merge reads only the chunks below the prefix
    (37, 5, 1, 8),
    (50, 50, 1, 64),     # k = T: the bound max(n_live, k) is the whole row
]


@pytest.mark.parametrize("kind, T, k, splits, lanes", [
    (kind, *case) for case in LIVE_BOUND_CASES for kind in ("randn", "ties", "extremes")  # extremes: -inf
    if not (kind == "randn" and case[3] == 256)])                                         # inside the prefix too
def test_live_bound_is_the_stable_sort(kind, T, k, splits, lanes):
    """With `n_live` (columns from n_live[b] on score -inf) the kernel's picks are the stable sort's
    of the whole row, at every live count around k, the sort lanes and T, and 0; and (extremes) its
    marked columns (-1 for a -inf pick) the sort's."""
    live = sorted({min(T, max(0, n)) for n in (0, 1, k - 1, k, k + 1, lanes - 1, lanes, lanes + 1, 256, 257, 600,
                                                T - 1, T)})  # 256, 257, 600: chunk edges of block 256
    s, n_live = _live_rows(kind, T, live, seed=T + k + splits)
    got = index_topk_triton(s, k, splits=splits, block=256, n_live=n_live, live_sort_lanes=lanes)
    _same(got, index_topk_reference(s, k))
    if kind == "extremes":  # the marks: -inf picks inside the prefix and past it (the other kinds: past it only)
        marked = index_topk_triton(s, k, mark_masked=True, write_values=False, splits=splits, block=256,
                                   n_live=n_live, live_sort_lanes=lanes)[1]
        want_v, want_c = index_topk_reference(s, k)
        assert torch.equal(marked, torch.where(torch.isneginf(want_v), -1, want_c))


def test_live_bound_reads_only_the_prefix():
    """A finite score past n_live (which the caller promises never to pass) is not picked: the
    kernel does not read past max(n_live, k), so the bound is really taken."""
    s, n_live = _live_rows("randn", 300, [20, 100], seed=5)
    s[:, 250] = 1e30  # would be every row's first pick if it were read
    for splits in (1, 3):  # rows of 20 (sorted whole in 64 lanes) and 100 live columns (selected)
        columns = index_topk_triton(s, 17, splits=splits, block=256, n_live=n_live, live_sort_lanes=64)[1]
        assert not (columns == 250).any()
        assert (index_topk_triton(s, 17, splits=splits, block=256)[1][:, 0] == 250).all()


@pytest.mark.parametrize("seed", range(2))
def test_random_shapes_and_schedules(seed):
    """Random T, k <= T, split counts (1 .. 5) and kinds: many small cases at once."""
    g = torch.Generator().manual_seed(100 + seed)
    for _ in range(4):
        T = int(torch.randint(1, 600, (1,), generator=g))
        k = int(torch.randint(1, T + 1, (1,), generator=g))
        splits = int(torch.randint(1, 6, (1,), generator=g))
        kind = KINDS[int(torch.randint(0, len(KINDS), (1,), generator=g))]
        s = _scores(kind, 2, T, seed=seed * 7 + T)
        _same(index_topk_triton(s, k, splits=splits, block=256), index_topk_reference(s, k))


@pytest.mark.parametrize("sort_all", [None, False])  # the rule's schedule at T 120 (sort all), the select
def test_leading_dims_strided_rows_and_marks(sort_all):
    """[B, S, T] scores (a prefill chunk's), a strided row view; mark_masked writes -1 for -inf."""
    full = _scores("holes", 6, 130, seed=3)
    s = full[:, 1:121].reshape(2, 3, 120)  # rows of stride 130
    values, columns = index_topk_triton(s, 70, mark_masked=True, block=256, sort_all=sort_all)
    want_v, want_c = index_topk_reference(s, 70)
    assert columns.shape == (2, 3, 70)
    assert torch.equal(columns, torch.where(torch.isneginf(want_v), -1, want_c))
    assert torch.equal(values, want_v)
    assert index_topk_triton(s, 70, write_values=False, block=256, sort_all=sort_all)[0] is None


@pytest.mark.parametrize("k", [0, 3, 40, 45])
def test_select_topk_and_sorted_top_dispatch(k):
    """impl="triton" gives the torch path's result: marks, and the -1 padding for k > T."""
    s = _scores("masked", 4, 40, seed=k)
    assert torch.equal(select_topk(s, k, impl="triton"), select_topk(s, k, impl="torch"))
    if k <= 40:
        _same(sorted_top(s, k, impl="triton"), sorted_top(s, k, impl="torch"))
        visible = (~torch.isneginf(s)).sum(-1).to(torch.int32)  # the "masked" rows: -inf past a prefix
        _same(sorted_top(s, k, impl="triton", n_live=visible), sorted_top(s, k, impl="torch", n_live=visible))


def test_reference_select_topk_marks():
    scores = torch.tensor([[[1.0, NEG_INF, 5.0, 3.0, 2.0]]])
    assert select_topk(scores, 3, impl="triton").tolist() == [[[2, 3, 4]]]
    assert select_topk(scores, 6, impl="triton").tolist() == [[[2, 3, 4, 0, -1, -1]]]


def test_split_rule():
    assert topk_splits(1, 2048, 512) == 1  # a short row: one launch
    assert topk_splits(4, 8192, 512) == 2  # chunks of >= 4096 columns
    assert topk_splits(1, 32768, 512) == 8
    assert topk_splits(32, 32768, 512) == 4
    assert topk_splits(1, 32768, 1024) == 5  # sqrt(32); the launch rounds chunks to the loop step: 4
    assert topk_splits(1, 262144, 512) == 22  # sqrt(512): the merge reads 22 x 512 keys
    assert topk_splits(200, 32768, 512) == 1


def test_bad_arguments_are_named():
    s = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="fp32"):
        index_topk_triton(s.half(), 2)
    with pytest.raises(ValueError, match="k must be"):
        index_topk_triton(s, 9)
    with pytest.raises(ValueError, match="sort_all"):
        index_topk_triton(torch.zeros(1, 4097), 2, sort_all=True)
    with pytest.raises(ValueError, match="n_live"):
        index_topk_triton(s, 2, n_live=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="live_sort_lanes"):
        index_topk_triton(torch.zeros(1, 2000), 2, n_live=torch.zeros(1, dtype=torch.int32), live_sort_lanes=1000)


def test_sweep_candidates_run_on_the_cpu():
    """`kernel_configs 'index topk'`: its case and a few of its candidates, exact at a small shape."""
    assert len(SHAPES) == 17 and all(k in (512, 1024) for _, _, k in SHAPES.values())
    scores = topk_case(2, 600, "cpu")
    assert torch.isneginf(scores[:, -18:]).all() and not torch.isneginf(scores[:, :-19]).any()
    run = topk_runner(scores, 40)
    want = run("torch.sort")
    for cfg in (None, dict(splits=2, block=256), dict(block=512, num_warps=4)):
        assert torch.equal(run(cfg), want), cfg


GPU_SHAPES = [(B, T, k) for k in (512, 1024) for B, T in ((1, 2048), (4, 2048), (1, 8192), (16, 8192), (1, 32768),
                                                          (32, 32768), (2, 131072))]


@pytest.mark.gpu
@pytest.mark.parametrize("B, T, k", GPU_SHAPES)
@pytest.mark.parametrize("kind", ("randn", "ties", "masked"))
def test_kernel_is_the_stable_sort_on_gpu(B, T, k, kind):
    """Against the CPU's stable sort (the definition: -0.0 equal to +0.0; see the next test)."""
    s = _scores(kind, B, T, seed=B + T + k, device="cuda")
    want = index_topk_reference(s.cpu(), k)
    for splits in (None, 1, 4):
        _same(tuple(t.cpu() for t in index_topk_triton(s, k, splits=splits)), want)


@pytest.mark.gpu
@pytest.mark.parametrize("B, T, k", [(1, 2112, 512), (8, 2112, 512), (1, 8192, 512), (4, 32768, 512), (1, 32768, 1024)])
@pytest.mark.parametrize("kind", ("randn", "ties"))
def test_live_bound_on_gpu(B, T, k, kind):
    """The decode step's call (n_live = the visible rows) at production lanes and schedules, every
    live count class: 0, below k, between k and the 1024 sort lanes, past them, T."""
    for live in ([0] * B, [k - 1] * B, [540 + 7 * b for b in range(B)], [min(T, 1500 + 300 * b) for b in range(B)],
                 [T] * B):
        s, n_live = _live_rows(kind, T, live, seed=T + sum(live))
        s, n_live = s.cuda(), n_live.cuda()
        want = index_topk_reference(s.cpu(), k)
        _same(tuple(t.cpu() for t in index_topk_triton(s, k, n_live=n_live)), want)


@pytest.mark.gpu
def test_torch_cuda_sort_holds_signed_zeros_equal():
    """Whether torch.sort on CUDA (CUB's radix sorts: the production path while the kernel is off)
    also keeps -0.0 and +0.0 in column order, both below and above its 4096-column block sort. If
    this fails, the kernel (= the CPU sort) orders such ties differently from the torch CUDA path
    the engine ran before: the only difference, and no wrong pick."""
    for T in (2048, 8192):
        s = torch.zeros(2, T)
        s[:, ::3] = -0.0
        s[:, 5::7] = 1.0
        want = torch.sort(s, dim=-1, descending=True, stable=True).indices
        assert torch.equal(torch.sort(s.cuda(), dim=-1, descending=True, stable=True).indices.cpu(), want)


@pytest.mark.gpu
def test_kernel_in_a_cuda_graph():
    """Captured once (split schedule and one launch), replayed over new scores: no host sync."""
    for B, T in ((4, 2048), (1, 32768)):
        s = _scores("ties", B, T, seed=T, device="cuda")
        index_topk_triton(s, 512)  # compile outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            values, columns = index_topk_triton(s, 512)
        for seed in range(3):
            s.copy_(_scores("masked", B, T, seed=seed, device="cuda"))
            graph.replay()
            _same((values.cpu(), columns.cpu()), index_topk_reference(s.cpu(), 512))
        n_live = torch.zeros(B, dtype=torch.int32, device="cuda")  # the live bound read on the device
        index_topk_triton(s, 512, n_live=n_live)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            values, columns = index_topk_triton(s, 512, n_live=n_live)
        for live in (600, 1500, T):
            rows, visible = _live_rows("ties", T, [live] * B, seed=live)
            s.copy_(rows)
            n_live.copy_(visible)
            graph.replay()
            _same((values.cpu(), columns.cpu()), index_topk_reference(s.cpu(), 512))
