"""The shared expert's gate | up FP8 GEMM with the clamped SwiGLU in its epilogue
(`fp8_linear_swiglu`; the last program of each pair of gate / up tiles sums both tiles' split
partials and writes h): bit for bit the unfused w1, w3 and SwiGLU kernel at the same kernel and K
split, for the tile and the weights-first kernels, several splits and M = 1 .. 32 rows, weight-only
and act numerics (interpreted on the CPU at small shapes; on the GPU at the Flash / Pro shapes)."""

import pytest
import torch
from cases import fp8_linear_case

from v4serve.ops import fp8_linear as fp8_linear_module
from v4serve.ops import fp8_linear_triton as triton_path
from v4serve.ops.fp8_linear import fp8_linear, fp8_linear_swiglu
from v4serve.ops.fp8_linear_triton import fp8_linear_triton
from v4serve.ops.swiglu import clamped_swiglu


def _halves(weight, scale, block):
    i = weight.shape[0] // 2
    return (weight[:i], scale[:i // block[0]]), (weight[i:], scale[i // block[0]:])


def _limit(x, weight, scale, block, act_block):
    """A limit that clamps about half the outputs (so both sides of every clamp are exercised)."""
    y = fp8_linear(x, weight, scale, block, act_block, impl="torch").float()
    return float(y.abs().median())


def _unfused(x, weight, scale, block, act_block, limit, config=None, split_k=None, arrivals=None):
    """Today's path: w1, w3 (the same kernel and split), the SwiGLU kernel."""
    (w1, s1), (w3, s3) = _halves(weight, scale, block)
    run = dict(config=None if config is None else dict(config), split_k=split_k, arrivals=arrivals)
    gate = fp8_linear_triton(x, w1, s1, block, act_block, **run)
    up = fp8_linear_triton(x, w3, s3, block, act_block, **dict(run, config=None if config is None else dict(config)))
    return clamped_swiglu(gate, up, limit, impl="triton")


# i (gate rows), k, block, split_k: one split, several, a last split shorter than the others; 64-row blocks
_SHAPES = [
    (128, 512, (128, 128), 1),
    (128, 512, (128, 128), 2),
    (64, 320, (64, 64), 3),
    (192, 256, (64, 128), 2),
]
_ROWS = [1, 4, 8, 16, 32]


@pytest.mark.parametrize("kernel", ["tiles", "ahead"])
@pytest.mark.parametrize("m", _ROWS)
@pytest.mark.parametrize("i, k, block, split_k", _SHAPES)
def test_fused_swiglu_gives_the_unfused_bits(monkeypatch, i, k, block, split_k, m, kernel):
    x, weight, scale = fp8_linear_case(m, 2 * i, k, block, seed=m + i + k)
    limit = _limit(x, weight, scale, block, None)
    config = dict(KERNEL=kernel, **(dict(MAX_STEPS=8) if kernel == "ahead" else {}))
    arrivals = torch.zeros(2 * i // 64, dtype=torch.int32)
    want = _unfused(x, weight, scale, block, None, limit, config, split_k)
    monkeypatch.setattr(triton_path, "clamped_swiglu_triton", None)  # one launch: the SwiGLU kernel is not run
    for _ in range(2):  # the pair tickets come back to zero, so a second launch fuses too
        got = fp8_linear_triton(x, weight, scale, block, None, config=dict(config), split_k=split_k,
                                arrivals=arrivals, swiglu_limit=limit)
        assert got.shape == (m, i) and torch.equal(got, want)
        assert not arrivals.any()


@pytest.mark.parametrize("m", [1, 8, 16])
@pytest.mark.parametrize("kernel", ["tiles", "ahead"])
def test_fused_swiglu_act_numerics(kernel, m):
    """The official numerics (activations e4m3 per 128): the same epilogue, the same bits."""
    i, k, block = 128, 512, (128, 128)
    x, weight, scale = fp8_linear_case(m, 2 * i, k, block, seed=7 * m)
    limit = _limit(x, weight, scale, block, 128)
    config = dict(KERNEL=kernel)
    arrivals = torch.zeros(2 * i // 64, dtype=torch.int32)
    want = _unfused(x, weight, scale, block, 128, limit, config, 2)
    got = fp8_linear_triton(x, weight, scale, block, 128, config=dict(config), split_k=2, arrivals=arrivals,
                            swiglu_limit=limit)
    assert torch.equal(got, want) and not arrivals.any()


@pytest.mark.parametrize("programs", [1, 6, 24])
@pytest.mark.parametrize("m", _ROWS)
def test_production_choice_is_the_members_choice(monkeypatch, m, programs):
    """No config: the kernel, tiles and K split are chosen for an I-row weight (each member's
    choice; with 6 / 24 programs wanted the members split K, the stacked weight alone would split it
    less), so the fused result has the bits of the members' production runs + the SwiGLU kernel;
    without counters the linear then the SwiGLU kernel, the same bits again."""
    monkeypatch.setattr(triton_path, "decode_programs_wanted", lambda device: programs)
    i, k, block = 128, 1024, (128, 128)
    x, weight, scale = fp8_linear_case(m, 2 * i, k, block, seed=m)
    limit = _limit(x, weight, scale, block, None)
    (w1, s1), (w3, s3) = _halves(weight, scale, block)
    member_counters = torch.zeros(2, dtype=torch.int32)
    gate = fp8_linear(x, w1, s1, block, impl="triton", arrivals=member_counters)
    up = fp8_linear(x, w3, s3, block, impl="triton", arrivals=member_counters)
    want = clamped_swiglu(gate, up, limit, impl="triton")
    arrivals = torch.zeros(4, dtype=torch.int32)
    assert torch.equal(fp8_linear_swiglu(x, weight, scale, limit, block, impl="triton", arrivals=arrivals), want)
    assert not arrivals.any()
    assert torch.equal(fp8_linear_swiglu(x, weight, scale, limit, block, impl="triton"), want)


def test_64_rows_on_the_decode_tiles():
    """33..64 rows where the prefill tiles would leave SMs idle take the decode tiles (BLOCK_M 64):
    the fused epilogue there too, the members' bits."""
    i, k, block = 128, 512, (128, 128)
    x, weight, scale = fp8_linear_case(64, 2 * i, k, block, seed=64)
    limit = _limit(x, weight, scale, block, None)
    arrivals = torch.zeros(4, dtype=torch.int32)
    want = _unfused(x, weight, scale, block, None, limit, None, 2)
    got = fp8_linear_triton(x, weight, scale, block, None, split_k=2, arrivals=arrivals, swiglu_limit=limit)
    assert torch.equal(got, want) and not arrivals.any()


def test_past_the_epilogue_rows_the_counters_are_not_used(monkeypatch):
    """`fp8_linear_swiglu` at SWIGLU_EPILOGUE_MAX_ROWS + 1 rows with counters: the linear without
    them, then the SwiGLU kernel (measured faster there), the same bits as the epilogue."""
    seen = []
    kernel = triton_path.fp8_linear_triton

    def recorded(*args, **kwargs):
        seen.append((args[0].shape[0], kwargs.get("arrivals") is not None))
        return kernel(*args, **kwargs)

    monkeypatch.setattr(fp8_linear_module, "fp8_linear_triton", recorded)
    i, k, block = 128, 512, (128, 128)
    rows = fp8_linear_module.SWIGLU_EPILOGUE_MAX_ROWS
    x, weight, scale = fp8_linear_case(rows + 1, 2 * i, k, block, seed=5)
    limit = _limit(x, weight, scale, block, None)
    arrivals = torch.zeros(4, dtype=torch.int32)
    got = fp8_linear_swiglu(x, weight, scale, limit, block, impl="triton", arrivals=arrivals)
    fp8_linear_swiglu(x[:rows], weight, scale, limit, block, impl="triton", arrivals=arrivals)
    assert seen == [(rows + 1, False), (rows, True)] and not arrivals.any()
    assert torch.equal(got, kernel(x, weight, scale, block, None, arrivals=arrivals, swiglu_limit=limit))


def test_prefill_rows_take_the_linear_then_the_swiglu_kernel():
    """Past the decode rows (the prefill tiles, named here): y then the SwiGLU kernel, the same bits
    as the members (no K split in the prefill tiles) and close to the torch reference."""
    i, k, block = 128, 256, (128, 128)
    x, weight, scale = fp8_linear_case(80, 2 * i, k, block, seed=3)
    limit = _limit(x, weight, scale, block, None)
    arrivals = torch.zeros(4, dtype=torch.int32)
    want = _unfused(x, weight, scale, block, None, limit, dict(KERNEL="prefill"))
    got = fp8_linear_triton(x, weight, scale, block, None, config=dict(KERNEL="prefill"), arrivals=arrivals,
                            swiglu_limit=limit)
    assert torch.equal(got, want)
    ref = fp8_linear_swiglu(x, weight, scale, limit, block, impl="torch")
    torch.testing.assert_close(got.float(), ref.float(), rtol=2**-6, atol=1e-6 * ref.float().abs().max().item())


def test_torch_reference_is_the_members_then_the_swiglu():
    i, k, block = 128, 256, (128, 128)
    x, weight, scale = fp8_linear_case(3, 2 * i, k, block, seed=11)
    (w1, s1), (w3, s3) = _halves(weight, scale, block)
    limit = _limit(x, weight, scale, block, 128)
    want = clamped_swiglu(fp8_linear(x, w1, s1, block, 128, impl="torch"), fp8_linear(x, w3, s3, block, 128,
                                                                                      impl="torch"), limit, impl="torch")
    assert torch.equal(fp8_linear_swiglu(x, weight, scale, limit, block, 128, impl="torch"), want)


def test_bad_stacked_weights_are_refused():
    x, weight, scale = fp8_linear_case(1, 192, 128, (128, 128))
    with pytest.raises(ValueError, match="2I rows"):
        fp8_linear_swiglu(x, weight, scale, 1.0, (128, 128), impl="torch")


@pytest.mark.gpu
@pytest.mark.parametrize("m", [*_ROWS, 64])
@pytest.mark.parametrize("model, i, k", [("flash", 2048, 4096), ("pro", 3072, 7168), ("flash tp8", 256, 4096)])
def test_fused_swiglu_gpu_production(model, i, k, m):
    """The production path on the GPU at the Flash / Pro shared expert (and a Flash tensor-parallel
    rank's, which the W8A16 rule puts on the weights-first kernel): the members' bits."""
    block = (128, 128)
    x, weight, scale = fp8_linear_case(m, 2 * i, k, block, seed=m, device="cuda")
    limit = _limit(x, weight, scale, block, None)
    (w1, s1), (w3, s3) = _halves(weight, scale, block)
    counters = torch.zeros(2 * i // 64, dtype=torch.int32, device="cuda")
    gate = fp8_linear(x, w1, s1, block, arrivals=counters)
    up = fp8_linear(x, w3, s3, block, arrivals=counters)
    want = clamped_swiglu(gate, up, limit)
    for _ in range(3):
        assert torch.equal(fp8_linear_swiglu(x, weight, scale, limit, block, arrivals=counters), want)
        assert not counters.any()
    ref = fp8_linear_swiglu(x.cpu(), weight.cpu(), scale.cpu(), limit, block, impl="torch")
    # (the reference sums K in one fp32 pass: near-cancelling outputs differ by more than ulps, hence atol)
    torch.testing.assert_close(want.cpu().float(), ref.float(), rtol=2**-5, atol=1e-2 * ref.float().abs().max().item())
