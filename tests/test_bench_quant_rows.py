"""`bench kernels` rows of the quantized-weight ops build and run on the CPU (timing needs a GPU),
with the floors' bytes: FP8 weights + scales + x + y; MXFP4 experts touched by the routing."""

import pytest
import torch

import v4serve.bench.shapes as shapes
from v4serve.bench.kernels import H200_FP8_TFLOPS, H200_TFLOPS, build
from v4serve.ops.fp8_linear import fp8_linear


def test_rows_are_listed():
    rows = {n: spec for n, spec in shapes.all_shapes().items() if spec[0] in ("fp8_linear", "mxfp4_moe")}
    assert {f"fp8 linear {mdl} wq_b M{m}" for mdl in ("flash", "pro") for m in (1, 8, 64, 2048)} <= set(rows)
    assert {f"mxfp4 moe {mdl} {c}" for mdl in ("flash", "pro") for c in ("c1", "c8", "c64", "prefill S2048")} <= set(rows)
    assert {f"fp8 linear w8a16 {mdl} draft_head M{m}" for mdl in ("flash", "pro") for m in (1, 8)} <= set(rows)
    assert rows["fp8 linear w8a16 flash draft_head M8"] == ("fp8_linear", (129280, 4096, 8, None))
    assert len(rows) == 2 * 6 * (4 + 2) + 2 * 2 + 2 * 4


@pytest.mark.parametrize("act_block", [128, None])
def test_fp8_row_runs_and_counts_the_weight_bytes(act_block):
    fn, nbytes, flops, _, peak = build("fp8_linear", (512, 4096, 1, act_block), "cpu")
    assert fn().shape == (1, 512)
    assert nbytes == 512 * 4096 + 4 * 4 * 32 + 4096 * 2 + 512 * 2 and flops == 2 * 512 * 4096
    assert peak == (H200_FP8_TFLOPS if act_block else H200_TFLOPS)
    x, weight, scale = shapes.fp8_linear_case(512, 4096, 1, "cpu")
    assert torch.equal(fn(), fp8_linear(x, weight, scale, act_block=act_block))


def test_moe_row_runs_and_counts_the_experts_touched(monkeypatch):
    monkeypatch.setitem(shapes.MOE_GEOMETRY, "tiny", (8, 64, 32))
    fn, nbytes, flops, _, _ = build("mxfp4_moe", ("tiny", 1), "cpu")
    out = fn()
    assert out.shape == (1, 64) and torch.isfinite(out.float()).all()
    per_expert = 64 * 64 // 2 + 64 * 64 // 32 + 64 * 32 // 2 + 64 * 32 // 32
    assert nbytes == 6 * per_expert + 64 * 2 * 2 + 8 * 2  # one token touches its 6 experts
    assert flops == 2 * 6 * (64 * 64 + 64 * 32)


def test_fp8_decode_sweep_runs_every_variant(monkeypatch, capsys):
    from v4serve.bench import fp8_decode_configs as sweep

    # in the interpreter one program is wanted: 10 steps a program ("long"), 2 steps ("short", "2 steps")
    tiny = {"fp8 decode tiny wq_b M1": (64, 1280, 1), "fp8 decode tiny wq_a M1": (64, 256, 1)}
    tiny_w8a16 = {"fp8 decode w8a16 tiny wq_b M1": (64, 1280, 1), "fp8 decode w8a16 tiny wq_a M1": (64, 256, 1)}
    tiny_rows = {"fp8 decode rows w8a16 tiny wq_b M32": (130, 256, 32)}  # (one split in the interpreter)
    monkeypatch.setattr(sweep, "SHAPES", tiny)
    monkeypatch.setattr(sweep, "W8A16_SHAPES", tiny_w8a16)
    monkeypatch.setattr(sweep, "ROWS_SHAPES", tiny_rows)
    sweep.sweep("fp8 decode", device="cpu", timer=lambda fn: float(fn().shape[0]))
    lines = capsys.readouterr().out.splitlines()
    rows = []
    for candidates in (sweep.CANDIDATES, sweep.W8A16_CANDIDATES):
        rows += [c[0] for c in candidates if c[3] in ("all", "long")] + [c[0] for c in candidates if c[3] != "long"]
    rows += [c[0] for c in sweep.ROWS_CANDIDATES if c[3] == "all"]
    assert [line.split("  ")[-1] for line in lines] == rows
    assert all(float(line.split("err ")[1].split()[0]) < 2**-7 for line in lines)  # one bf16 ulp at most


def test_fp8_decode_swiglu_sweep_rows_agree_bit_for_bit(monkeypatch, capsys):
    """The shared expert's gate | up + SwiGLU rows (fused, unfused, no counters) run and give the same bits."""
    from v4serve.bench import fp8_decode_configs as sweep

    monkeypatch.setattr(sweep, "SWIGLU_SHAPES", {"fp8 decode swiglu tiny shared_w1+w3 M4": (128, 256, 4)})
    sweep.sweep_swiglu("fp8 decode swiglu", device="cpu", timer=lambda fn: float(fn().shape[0]))
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[-1] for line in lines] == ["production", "unfused", "no counters", "production"]
    assert all(" differing 0 " in line for line in lines)
