"""The weight-only (W8A16) FP8 decode path: the weights-first kernel in weight-only numerics and the
tile kernel with the split partials summed by the last program of a tile, against the torch
reference (interpreted on the CPU at small shapes, on the GPU at the Flash projections), against
each other bit for bit where they add the same numbers in the same order, and the production rule."""

import pytest
import torch
from cases import fp8_linear_case

from v4serve.ops import fp8_linear_triton as triton_path
from v4serve.ops.fp8_linear import fp8_linear
from v4serve.ops.fp8_linear_triton import W8A16_DECODE_OTHERWISE, W8A16_DECODE_RULE, fp8_linear_triton


def _run(x, weight, scale, block, split_k, kernel, arrivals=None, **cfg):
    extra = dict(MAX_STEPS=8) if kernel == "ahead" else {}
    return fp8_linear_triton(x, weight, scale, block, None, config=dict(KERNEL=kernel, **extra, **cfg),
                             split_k=split_k, arrivals=arrivals)


def _close(got, want):
    """Exact products (e4m3 codes in bf16, power-of-two scales), fp32 sums in another order: one bf16 ulp."""
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6 * want.float().abs().max().item())


# m, n, k, block, split_k: partial N tiles and K steps, several splits, 32-wide blocks, all 16 rows
_CASES = [
    (1, 130, 300, (128, 128), 3),
    (5, 70, 600, (128, 128), 2),   # 5 steps: 4 a program (ahead), 3 + 2 (tiles)
    (2, 72, 100, (32, 32), 2),
    (16, 64, 256, (128, 128), 2),
]


@pytest.mark.parametrize("in_order", [False, True], ids=["tree", "in_order"])
@pytest.mark.parametrize("m, n, k, block, split_k", _CASES)
def test_weights_first_weight_only_matches_the_reference(m, n, k, block, split_k, in_order):
    x, weight, scale = fp8_linear_case(m, n, k, block, seed=m + n)
    want = fp8_linear(x, weight, scale, block, impl="torch")
    arrivals = torch.zeros(n, dtype=torch.int32)
    _close(_run(x, weight, scale, block, split_k, "ahead", IN_ORDER=in_order), want)
    _close(_run(x, weight, scale, block, split_k, "ahead", arrivals, IN_ORDER=in_order, SUM_LAST=True), want)
    assert not arrivals.any()


@pytest.mark.parametrize("m, n, k, block, split_k", _CASES)
def test_last_program_sum_gives_the_sum_kernels_bits_and_leaves_zeros(m, n, k, block, split_k):
    x, weight, scale = fp8_linear_case(m, n, k, block, seed=k)
    arrivals = torch.zeros(n, dtype=torch.int32)
    for kernel in ("tiles", "ahead"):
        base = _run(x, weight, scale, block, split_k, kernel)
        for _ in range(2):  # the counters come back to zero, so a second launch sums too
            assert torch.equal(_run(x, weight, scale, block, split_k, kernel, arrivals, SUM_LAST=True), base)
            assert not arrivals.any()
        _close(base, fp8_linear(x, weight, scale, block, impl="torch"))


def test_in_order_steps_give_the_tile_kernels_bits_where_the_splits_agree():
    """4 steps a program in both kernels (K 1024, 2 splits): the weights-first kernel adding its
    steps' scaled partials in order from zero is the tile kernel's loop, bit for bit."""
    x, weight, scale = fp8_linear_case(3, 130, 1024, (128, 128), seed=5)
    tiles = _run(x, weight, scale, (128, 128), 2, "tiles")
    assert torch.equal(_run(x, weight, scale, (128, 128), 2, "ahead", IN_ORDER=True), tiles)


def test_production_rule_by_steps_a_program(monkeypatch):
    """On 132 SMs (264 programs wanted) the Flash projections fall under the rule's keys; the rule's
    kernel is what runs, and an "ahead" choice lifts MAX_N / MAX_STEPS (the rule is the choice)."""
    monkeypatch.setattr(triton_path, "decode_programs_wanted", lambda device: 264)
    cpu = torch.device("cpu")
    flash = {"wkv": (512, 4096, 1), "wq_a": (1024, 4096, 2), "shared w1": (2048, 4096, 4),
             "shared w2": (4096, 2048, 4), "wq_b": (32768, 1024, 8), "wo_b": (4096, 8192, 16)}
    for name, (n, k, steps) in flash.items():
        choice = triton_path.w8a16_decode_choice(n, k, (128, 128), cpu)
        want = W8A16_DECODE_RULE.get(steps, W8A16_DECODE_OTHERWISE)
        assert choice["KERNEL"] == want["KERNEL"], name
        if choice["KERNEL"] == "ahead":
            assert choice["MAX_N"] == n and choice["MAX_STEPS"] >= steps


def test_production_weight_only_decode_with_and_without_counters():
    """fp8_linear's production path (CPU interpreter: one split) with the caller's counters equals
    the one without, and both the reference; fp32 x takes the tiles."""
    x, weight, scale = fp8_linear_case(2, 130, 300, (128, 128), seed=9)
    want = fp8_linear(x, weight, scale, impl="torch")
    arrivals = torch.zeros(3, dtype=torch.int32)
    got = fp8_linear(x, weight, scale, impl="triton")
    assert torch.equal(fp8_linear(x, weight, scale, impl="triton", arrivals=arrivals), got)
    _close(got, want)
    got32 = fp8_linear(x.float(), weight, scale, impl="triton")
    torch.testing.assert_close(got32, fp8_linear(x.float(), weight, scale, impl="torch"), rtol=1e-5,
                               atol=1e-5 * got32.abs().max().item())


# GPU: the Flash projections at M 1 and 8 in W8A16; production (with the counters a module keeps and
# without), every kernel, in CUDA graphs (counters back to zero, no host sync)
_FLASH = {"wq_a": (1024, 4096), "wq_b": (32768, 1024), "wkv": (512, 4096), "wo_b": (4096, 8192),
          "shared w1": (2048, 4096), "shared w2": (4096, 2048), "indexer q_b": (8192, 1024)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name, m", [(name, 1) for name in _FLASH] + [("wq_a", 8), ("shared w1", 8)])
def test_gpu_w8a16_flash_projections(name, m):
    n, k = _FLASH[name]
    x, weight, scale = fp8_linear_case(m, n, k, (128, 128), seed=n + m, device="cuda")
    want = fp8_linear(x, weight, scale, impl="torch")
    tol = dict(rtol=2**-7, atol=1e-4 * want.float().abs().max().item())
    tiles = _run(x, weight, scale, (128, 128), None, "tiles")  # production before session 13: its bits
    torch.testing.assert_close(tiles.float(), want.float(), **tol)
    arrivals = torch.zeros(n, dtype=torch.int32, device="cuda")
    prod = fp8_linear(x, weight, scale, impl="triton", arrivals=arrivals)
    torch.testing.assert_close(prod.float(), want.float(), **tol)
    assert torch.equal(fp8_linear(x, weight, scale, impl="triton"), prod)  # the sum kernel: the same bits
    assert torch.equal(_run(x, weight, scale, (128, 128), None, "tiles", arrivals, SUM_LAST=True), tiles)
    split = 2 if name in ("wq_b", "wo_b") else None  # (their default split has 8 / 16 steps a program)
    ahead = _run(x, weight, scale, (128, 128), split, "ahead")
    torch.testing.assert_close(ahead.float(), want.float(), **tol)
    # the same split boundaries and step order as the tiles (1, 2 or 4 steps): the same bits
    if name in ("wq_a", "wkv", "shared w1", "shared w2"):
        assert torch.equal(_run(x, weight, scale, (128, 128), None, "ahead", IN_ORDER=True), tiles)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fp8_linear(x, weight, scale, impl="triton", arrivals=arrivals)
    for _ in range(3):
        out.zero_()
        graph.replay()
        assert torch.equal(out, prod)
    assert not arrivals.any()
