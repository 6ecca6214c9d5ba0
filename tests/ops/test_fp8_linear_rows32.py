"""The weight-only (W8A16) FP8 linear at 17..32 rows (verify batches, plain decode at c17..c32): the
decode tiles with every row in one BLOCK_M = 32 tile, against the torch reference; each row of a
batch gets the bits it gets in a batch of 1, 8 or 16 rows (the K split and step order do not depend
on M nor on the tile variant), which is what lets a verify step's rows equal the plain step's; the
dispatch (W8A16_DECODE_ALWAYS_M) and the sweep's tile variants. CPU: the interpreter at small shapes;
GPU: the Flash and Pro projections at 16 and 32 rows."""

import pytest
import torch
from cases import fp8_linear_case

from v4serve.ops import fp8_linear_triton as triton_path
from v4serve.ops.fp8_linear import fp8_linear
from v4serve.ops.fp8_linear_triton import fp8_linear_triton


def _close(got, want):
    """Exact products (e4m3 codes in bf16, power-of-two scales), fp32 sums in another order: one bf16 ulp."""
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-6 * want.float().abs().max().item())


def _production(x, weight, scale, block=(128, 128), arrivals=None):
    return fp8_linear(x, weight, scale, block, impl="triton", arrivals=arrivals)


# n, k, block, programs wanted (the split the GPU would take: decode_programs_wanted), steps a program
_SPLIT_CASES = [
    (130, 600, (128, 128), 264),   # 3 N tiles x 5 splits of 1 step: "ahead" up to 16 rows, tiles at 17..32
    (130, 1024, (128, 128), 12),   # 3 x 4 splits of 2 steps: the tiles at every M
    (72, 200, (32, 32), 2),        # V4.1's 32 x 32 blocks (the scales applied before the dot), 1 split
]


# The interpreter's dot is numpy's matmul (OpenBLAS sgemm), whose fp32 result for a row depends on the
# matrix's shape and the row's place in it (a [16, 128] @ [128, 64] tile against a [32, 128] one: up to
# 7% of the outputs 1 fp32 ulp apart, numpy 2 / OpenBLAS 0.3.30 Haswell); the GPU's MMA computes each
# output alone. So fp32 x (y in fp32: another K split or step order shows in most outputs) compares
# rows between tiles of one shape (BLOCK_M 16: 1..16 rows; 32: 17..32), and bf16 x (the models' path)
# across the two shapes, where the rounding to bf16 absorbs that noise for these inputs; the GPU test
# compares any rows.
_ROW_COUNTS = {torch.float32: (1, 8, 17, 24), torch.bfloat16: (1, 8, 16, 17, 24)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("n, k, block, programs", _SPLIT_CASES)
def test_rows_of_a_32_row_batch_get_the_bits_of_smaller_batches(monkeypatch, n, k, block, programs, dtype):
    """The first m rows alone and in a batch of 32 (fp32: of 16 or 32, the tile shape of m): the same
    bits. bf16 x runs production as the models do (the weights-first kernel up to 16 rows where the
    rule says so, the tiles at 17..32); fp32 x the tiles at every M."""
    monkeypatch.setattr(triton_path, "decode_programs_wanted", lambda device: programs)
    x, weight, scale = fp8_linear_case(32, n, k, block, seed=n + k)
    x = x.to(dtype)
    arrivals = torch.zeros(n, dtype=torch.int32)
    y32 = _production(x, weight, scale, block, arrivals)
    _close(y32, fp8_linear(x, weight, scale, block, impl="torch"))
    assert not arrivals.any()
    y16 = _production(x[:16], weight, scale, block, arrivals)
    for m in _ROW_COUNTS[dtype]:
        want = y16[:m] if dtype == torch.float32 and m <= 16 else y32[:m]
        assert torch.equal(_production(x[:m], weight, scale, block, arrivals), want), m
    assert torch.equal(_production(x, weight, scale, block), y32)  # the sum kernel: the same bits


@pytest.mark.parametrize("m, dtype", [(17, torch.bfloat16), (24, torch.float32), (32, torch.bfloat16),
                                      (32, torch.float32)])
def test_tile_variants_at_32_rows_give_production_bits(monkeypatch, m, dtype):
    """The sweep's variants: 8 warps, 3 stages, the last-program sum, 128 / 256 weight rows a program (the K
    split stays the 64-row tiling's; bf16 only: another dot shape in the interpreter, see above); the
    prefill tiles (production before session 14 where they filled the GPU) agree within the fp32
    order; sm_80's integer decode of the codes: the same bits."""
    monkeypatch.setattr(triton_path, "decode_programs_wanted", lambda device: 12)
    n, k = 130, 512
    x, weight, scale = fp8_linear_case(m, n, k, (128, 128), seed=m)
    x = x.to(dtype)
    arrivals = torch.zeros(n, dtype=torch.int32)
    prod = _production(x, weight, scale, arrivals=arrivals)
    variants = [dict(num_warps=8), dict(num_stages=3), dict(SUM_LAST=True)]
    if dtype == torch.bfloat16:
        variants += [dict(BLOCK_N=128), dict(BLOCK_N=128, num_warps=8), dict(BLOCK_N=256, num_warps=8, num_stages=3)]
    for cfg in variants:
        got = fp8_linear_triton(x, weight, scale, (128, 128), None, config=dict(KERNEL="tiles", **cfg),
                                arrivals=arrivals)
        assert torch.equal(got, prod), cfg
        assert not arrivals.any()
    assert torch.equal(fp8_linear_triton(x, weight, scale, (128, 128), None, fp8_hw=False), prod)
    prefill = fp8_linear_triton(x, weight, scale, (128, 128), None, config=dict(KERNEL="prefill"))
    _close(prefill, fp8_linear(x, weight, scale, impl="torch"))
    _close(prod, fp8_linear(x, weight, scale, impl="torch"))


def test_weight_only_takes_the_decode_tiles_up_to_32_rows(monkeypatch):
    """On 132 SMs: Flash wq_b [32768, 1024] (256 prefill programs) at 32 rows takes the decode tiles in
    weight-only numerics (W8A16_DECODE_ALWAYS_M) and the prefill tiles with quantized activations;
    33 rows and up keep the rule of the prefill grid; the production choice at 17..32 rows is
    W8A16_ROWS32_RULE's."""
    monkeypatch.setattr(triton_path, "compiled_on_cuda", lambda device: True)
    monkeypatch.setattr(triton_path, "sm_count", lambda device: 132)
    monkeypatch.setattr(triton_path, "decode_programs_wanted", lambda device: 264)
    gpu = torch.device("cuda", 0)
    use = triton_path._use_decode_tiles
    assert use(32, 32768, gpu, weight_only=True) == (triton_path.W8A16_DECODE_ALWAYS_M >= 32)
    assert use(16, 32768, gpu, weight_only=True) and use(16, 32768, gpu)
    assert not use(32, 32768, gpu) and not use(33, 32768, gpu, weight_only=True)
    assert use(32, 1024, gpu) and use(64, 4096, gpu)  # 8 / 32 prefill programs: the decode tiles
    for n, k in ((32768, 1024), (512, 4096), (4096, 8192)):
        choice = triton_path.w8a16_decode_choice(n, k, (128, 128), gpu, 32)
        assert choice["KERNEL"] == "tiles"  # (the weights-first kernel at 32 rows spilled: not a choice)
        steps = triton_path.ahead_steps(k, 128, -(-n // 64), 264, None)[1]
        assert choice == triton_path.W8A16_ROWS32_RULE.get(steps, triton_path.W8A16_ROWS32_OTHERWISE)
    assert triton_path.w8a16_decode_choice(512, 4096, (128, 128), gpu, 16)["KERNEL"] == "ahead"  # (M <= 16's rule)


def test_the_k_split_does_not_depend_on_the_tile_width(monkeypatch):
    monkeypatch.setattr(triton_path, "decode_programs_wanted", lambda device: 264)
    cpu = torch.device("cpu")
    assert triton_path.decode_split_k(32768, 8, cpu) == 1   # Flash wq_b: 512 tiles of 64 rows
    assert triton_path.decode_split_k(512, 32, cpu) == 32   # Flash wkv: 8 tiles, 33 wanted splits, 32 steps
    assert triton_path.decode_split_k(1024, 32, cpu) == 17  # Flash wq_a (17 wanted, then 16 of 2 steps)


# GPU: the Flash and Pro projections at 16 and 32 rows in W8A16
_SHAPES = {("flash", "wq_a"): (1024, 4096), ("flash", "wq_b"): (32768, 1024), ("flash", "wkv"): (512, 4096),
           ("flash", "wo_b"): (4096, 8192), ("flash", "shared w1"): (2048, 4096), ("flash", "shared w2"): (4096, 2048),
           ("flash", "indexer q_b"): (8192, 1024), ("flash", "wq_a+wkv"): (1536, 4096),
           ("pro", "wq_a"): (1536, 7168), ("pro", "wq_b"): (65536, 1536), ("pro", "wkv"): (512, 7168),
           ("pro", "wo_b"): (7168, 16384), ("pro", "shared w1"): (3072, 7168), ("pro", "shared w2"): (7168, 3072)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model, name", list(_SHAPES))
def test_gpu_w8a16_32_rows(model, name):
    """Production at 32 rows against the reference; its rows equal production's at 1, 8 and 16 rows
    (the plain step's bits); the sweep's tile variants equal it; the prefill tiles agree within the
    fp32 order; one CUDA graph replays it with the counters a module keeps (back to zero)."""
    n, k = _SHAPES[model, name]
    x, weight, scale = fp8_linear_case(32, n, k, (128, 128), seed=n + k, device="cuda")
    want = fp8_linear(x, weight, scale, impl="torch")
    tol = dict(rtol=2**-7, atol=1e-4 * want.float().abs().max().item())
    arrivals = torch.zeros(n, dtype=torch.int32, device="cuda")
    prod = _production(x, weight, scale, arrivals=arrivals)
    torch.testing.assert_close(prod.float(), want.float(), **tol)
    for rows in (slice(0, 1), slice(8, 16), slice(16, 32)):
        assert torch.equal(_production(x[rows], weight, scale, arrivals=arrivals), prod[rows]), rows
    if triton_path.W8A16_DECODE_ALWAYS_M >= 32:  # the decode tiles at 32 rows: the variants' bits
        for cfg in (dict(), dict(SUM_LAST=True), dict(BLOCK_N=128), dict(BLOCK_N=128, num_warps=8),
                    dict(BLOCK_N=256, num_warps=8, num_stages=3), dict(num_stages=3)):
            got = fp8_linear_triton(x, weight, scale, (128, 128), None, config=dict(KERNEL="tiles", **cfg),
                                    arrivals=arrivals)
            assert torch.equal(got, prod), cfg
    prefill = fp8_linear_triton(x, weight, scale, (128, 128), None, config=dict(KERNEL="prefill"))
    torch.testing.assert_close(prefill.float(), want.float(), **tol)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _production(x, weight, scale, arrivals=arrivals)
    for _ in range(3):
        out.zero_()
        graph.replay()
        assert torch.equal(out, prod)
    assert not arrivals.any()
