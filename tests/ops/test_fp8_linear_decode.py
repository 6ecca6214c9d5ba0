"""The weights-first FP8 decode kernel (ops/fp8_linear_decode_triton.py) against the torch reference
(interpreted on the CPU at small shapes, on the GPU at the Flash projections), its variants against
each other bit for bit where they must agree, and the plan that picks it."""

import pytest
import torch
from cases import fp8_linear_case

from v4serve.ops.fp8_linear import fp8_linear
from v4serve.ops.fp8_linear_decode_triton import ahead_steps
from v4serve.ops.fp8_linear_triton import decode_ahead_plan, fp8_linear_triton


def _ahead(x, weight, scale, block, act_block, split_k, arrivals=None, **cfg):
    return fp8_linear_triton(x, weight, scale, block, act_block, config=dict(KERNEL="ahead", MAX_STEPS=8, **cfg),
                             split_k=split_k, arrivals=arrivals)


# m, n, k, block, act_block, split_k: partial N tiles and K steps, one split (y written directly) and several
_CASES = [
    (1, 130, 300, (128, 128), 128, 1),
    (3, 130, 300, (128, 128), 128, 3),
    (5, 70, 600, (128, 128), 128, 2),   # 5 steps: 4 a program, the second split masked past K
    (2, 72, 100, (32, 32), 32, 2),      # the V4.1 numerics (32-channel groups and steps)
    (16, 64, 256, (128, 128), 128, 2),  # every row of the MMA tile real
]


@pytest.mark.parametrize("quant_a", [True, False], ids=["quant_a", "codes"])
@pytest.mark.parametrize("m, n, k, block, act_block, split_k", _CASES)
def test_ahead_kernel_matches_the_reference(m, n, k, block, act_block, split_k, quant_a):
    x, weight, scale = fp8_linear_case(m, n, k, block, seed=m + n)
    assert decode_ahead_plan(m, n, k, block, act_block, True, x.device, dict(MAX_STEPS=8), split_k) is not None
    want = fp8_linear(x, weight, scale, block, act_block=act_block, impl="torch").float()
    got = _ahead(x, weight, scale, block, act_block, split_k, QUANT_A=quant_a).float()
    # exact products, fp32 sums in another order: one bf16 ulp
    torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-6 * want.abs().max().item())


@pytest.mark.parametrize("m, n, k, block, act_block, split_k", [c for c in _CASES if c[-1] > 1])
def test_variants_give_the_same_bits(m, n, k, block, act_block, split_k):
    """Quantizing in the kernel gives act_quant's codes; the last-arriving sum adds the partials in
    split order, as the sum kernel does; the counters are left at zero for the next launch."""
    x, weight, scale = fp8_linear_case(m, n, k, block, seed=k)
    base = _ahead(x, weight, scale, block, act_block, split_k, QUANT_A=False)
    assert torch.equal(_ahead(x, weight, scale, block, act_block, split_k, QUANT_A=True), base)
    arrivals = torch.zeros(n, dtype=torch.int32)
    for _ in range(2):
        assert torch.equal(_ahead(x, weight, scale, block, act_block, split_k, arrivals, SUM_LAST=True), base)
        assert not arrivals.any()
        # counters handed in: the last program sums (SUM_LAST unless the config says otherwise)
        assert torch.equal(_ahead(x, weight, scale, block, act_block, split_k, arrivals), base)
        assert not arrivals.any()


def test_plan_splits_into_power_of_two_steps_and_keeps_long_programs_on_the_tiles():
    # Flash projections on 132 SMs (264 programs wanted), 64-row tiles, 128-channel steps
    assert ahead_steps(4096, 128, 16, 264, None) == (16, 2)   # wq_a
    assert ahead_steps(4096, 128, 8, 264, None) == (32, 1)    # wkv
    assert ahead_steps(4096, 128, 32, 264, None) == (8, 4)    # shared w1
    assert ahead_steps(2048, 128, 64, 264, None) == (4, 4)    # shared w2
    assert ahead_steps(1024, 128, 128, 264, None) == (2, 4)   # indexer q_b: 3 splits would need 3 steps
    assert ahead_steps(1024, 128, 512, 264, None) == (1, 8)   # wq_b: 8 steps, over MAX_STEPS
    assert ahead_steps(600, 128, 2, 1, 3) == (3, 2)           # split_k 3 of 5 steps
    cpu = torch.device("cpu")
    assert decode_ahead_plan(1, 130, 300, (128, 128), 128, True, cpu) is not None
    assert decode_ahead_plan(1, 130, 300, (128, 128), None, True, cpu)[0]["QUANT_A"] is False  # weight-only
    assert decode_ahead_plan(1, 130, 300, (128, 128), None, True, cpu, x_dtype=torch.float32) is None  # fp32 x
    assert decode_ahead_plan(1, 130, 300, (128, 128), 128, False, cpu) is None  # no FP8 (sm_80)
    assert decode_ahead_plan(17, 130, 300, (128, 128), 128, True, cpu) is None  # more rows than BLOCK_M
    assert decode_ahead_plan(1, 130, 1024, (128, 128), 128, True, cpu) is None  # 8 steps in one program
    cfg, splits, steps = decode_ahead_plan(1, 130, 1024, (128, 128), 128, True, cpu, split_k=2)
    assert (splits, steps, cfg["QUANT_A"]) == (2, 4, True)


def test_x_it_cannot_read_as_words_is_quantized_by_act_quant_first():
    x, weight, scale = fp8_linear_case(2, 64, 258, (128, 128))
    assert decode_ahead_plan(2, 64, 258, (128, 128), 128, True, x.device, x_words=False)[0]["QUANT_A"] is False
    wide = torch.cat([x[:, :1], x, x[:, :1]], 1)  # [2, 260]: x at a 2-byte offset
    odd_stride = torch.cat([x, x[:, :1]], 1)[:, :258]  # row stride 259 elements
    for z in (x, x.float(), wide[:, 1:259], odd_stride):  # words; fp32; 2-byte offset; odd row stride
        assert torch.equal(z.bfloat16(), x)
        want = fp8_linear(z, weight, scale, act_block=128, impl="torch").float()
        got = _ahead(z, weight, scale, (128, 128), 128, 1).float()
        torch.testing.assert_close(got, want, rtol=2**-7, atol=1e-6 * want.abs().max().item())


# GPU: the Flash projections at M 1 and 8, every variant; CUDA-graph replays (the counters must
# come back to zero, no host sync)
_FLASH = {"wq_a": (1024, 4096), "wq_b": (32768, 1024), "wkv": (512, 4096), "wo_b": (4096, 8192),
          "shared w1": (2048, 4096), "shared w2": (4096, 2048)}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 8])
@pytest.mark.parametrize("name", list(_FLASH))
def test_gpu_flash_projections_every_variant(name, m):
    n, k = _FLASH[name]
    x, weight, scale = fp8_linear_case(m, n, k, (128, 128), seed=n + m, device="cuda")
    want = fp8_linear(x, weight, scale, act_block=128, impl="torch").float()
    prod = fp8_linear(x, weight, scale, act_block=128, impl="triton")
    tol = dict(rtol=2**-6, atol=1e-3 * want.abs().max().item())
    torch.testing.assert_close(prod.float(), want, **tol)
    assert torch.equal(fp8_linear(x, weight, scale, act_block=128, impl="triton"), prod)  # deterministic
    split = 2 if name in ("wq_b", "wo_b") else None  # (their default split has 8 / 16 steps a program)
    base = _ahead(x, weight, scale, (128, 128), 128, split, QUANT_A=False)
    torch.testing.assert_close(base.float(), want, **tol)
    assert torch.equal(_ahead(x, weight, scale, (128, 128), 128, split), base)
    arrivals = torch.zeros(n, dtype=torch.int32, device="cuda")
    graph = torch.cuda.CUDAGraph()
    _ahead(x, weight, scale, (128, 128), 128, split, arrivals, SUM_LAST=True)  # compiled before the capture
    with torch.cuda.graph(graph):
        out = _ahead(x, weight, scale, (128, 128), 128, split, arrivals, SUM_LAST=True)
    for _ in range(3):
        out.zero_()
        graph.replay()
        assert torch.equal(out, base)
    assert not arrivals.any()
    # the public entry with counters kept by the caller: the same bits as production's second launch
    assert torch.equal(fp8_linear(x, weight, scale, act_block=128, impl="triton", arrivals=arrivals), prod)
    assert not arrivals.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("m", [1, 8])
def test_gpu_v41_blocks(m):
    """32-channel groups and steps (V4.1): production picks the weights-first kernel at this shape."""
    x, weight, scale = fp8_linear_case(m, 256, 1024, (32, 32), seed=m, device="cuda")
    assert decode_ahead_plan(m, 256, 1024, (32, 32), 32, True, x.device) is not None
    want = fp8_linear(x, weight, scale, (32, 32), act_block=32, impl="torch").float()
    got = fp8_linear(x, weight, scale, (32, 32), act_block=32, impl="triton").float()
    torch.testing.assert_close(got, want, rtol=2**-6, atol=1e-3 * want.abs().max().item())
