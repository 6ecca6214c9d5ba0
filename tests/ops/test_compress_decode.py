"""One compressor decode step: the Triton kernel (interpreted on the CPU) against the torch
reference over a run of steps that complete blocks at different times for different sequences,
comparing the rows, their targets and the whole compressor state after every step. (The
reference is the decode path of the model, checked against transformers by tests/model.)"""

import pytest
import torch

from v4serve.ops.compress_decode import compress_decode


def _state(overlap, slots, ratio, d, device):
    if overlap:
        kv = torch.zeros(slots, 2 * ratio, 2 * d, device=device)
        return kv, torch.full_like(kv, float("-inf"))
    return tuple(torch.full((slots, d), v, device=device) for v in (float("-inf"), 0.0, 0.0))


def _run_steps(overlap, ratio, d, rope_pairs, out_dtype, device="cpu", B=3, fused_input=False):
    """Step B sequences (at different offsets in their blocks) through 2 * ratio + 3 tokens with both
    implementations; compare after every step. Returns (blocks written, blocks sent to scratch).
    fused_input: kv and score are column slices of one wider projection (row-strided views)."""
    gen = torch.Generator().manual_seed(ratio * d)
    n_slots, steps = B + 2, 2 * ratio + 3
    width = (2 if overlap else 1) * d
    slots = torch.randperm(n_slots, generator=gen)[:B].to(device)
    positions = (torch.arange(B) * 7) % (2 * ratio)  # blocks complete at different steps
    positions[1] = ratio - 2  # sequence 1 completes its block 1 (no pool row) during the run
    positions = positions.to(device)
    bias = torch.randn(ratio, width, generator=gen).to(device)
    weight = (torch.rand(d, generator=gen) + 0.5).to(device)
    rows_of = torch.arange(B * 8, dtype=torch.int32).view(B, 8)
    rows_of[1, 1] = -1  # a block whose pool row does not exist: goes to scratch
    rows_of = rows_of.to(device)
    inv_freq = torch.linspace(0.01, 1, rope_pairs, device=device)
    states = {impl: _state(overlap, n_slots, ratio, d, device) for impl in ("torch", "triton")}
    written, to_scratch = 0, 0  # completed blocks with a pool row / without one
    for _ in range(steps):
        kv = torch.randn(B, width, generator=gen).to(device)
        score = (torch.randn(B, width, generator=gen) * 2).to(device)
        if fused_input:
            kv, score, _ = torch.cat((kv, score, torch.zeros(B, 8, device=device)), 1).split([width, width, 8], 1)
        angles = (positions + 1 - ratio).float()[:, None] * inv_freq[None]
        out = {impl: compress_decode(kv, score, positions, slots, bias, states[impl], ratio, weight, 1e-6,
                                     angles.cos(), angles.sin(), rows_of, 99, out_dtype, impl=impl)
               for impl in ("torch", "triton")}
        complete = (positions + 1) % ratio == 0
        torch.testing.assert_close(out["triton"][1], out["torch"][1], rtol=0, atol=0)
        tol = 1e-5 if out_dtype == torch.float32 else 1e-2
        torch.testing.assert_close(out["triton"][0].float(), out["torch"][0].float(), rtol=tol, atol=tol)
        assert (out["triton"][0][~complete] == 0).all()
        assert (out["triton"][1][~complete] == 99).all()
        written += int((complete & (out["triton"][1] != 99)).sum())
        to_scratch += int((complete & (out["triton"][1] == 99)).sum())
        for got, want in zip(states["triton"], states["torch"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        positions = positions + 1
    return written, to_scratch


@pytest.mark.parametrize("overlap, ratio, d, rope_pairs", [(True, 4, 32, 8), (True, 3, 24, 4), (False, 8, 32, 8),
                                                           (False, 5, 48, 6)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_triton_step_matches_the_reference(overlap, ratio, d, rope_pairs, out_dtype):
    written, to_scratch = _run_steps(overlap, ratio, d, rope_pairs, out_dtype)
    assert written >= 3 and to_scratch == 1  # the run completed blocks, one of them without a pool row


@pytest.mark.parametrize("overlap, ratio", [(True, 4), (False, 8)])
def test_triton_step_reads_row_strided_inputs(overlap, ratio):
    written, to_scratch = _run_steps(overlap, ratio, 32, 8, torch.bfloat16, fused_input=True)
    assert written >= 3 and to_scratch == 1


@pytest.mark.gpu
@pytest.mark.parametrize("overlap, ratio, d", [(True, 4, 512), (True, 4, 128), (False, 128, 512)])
def test_triton_step_at_model_shapes_on_gpu(overlap, ratio, d):
    """CSA kv (d 512), the indexer's keys (d 128) and HCA (ratio 128), 64 sequences, bf16 rows."""
    written, to_scratch = _run_steps(overlap, ratio, d, 32, torch.bfloat16, device="cuda", B=64)
    assert written >= 64 and to_scratch == 1


def test_bad_arguments_are_named():
    state = _state(True, 2, 4, 8, "cpu")
    kv = torch.zeros(1, 16)
    args = (torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), torch.zeros(4, 16), state, 4,
            torch.ones(8), 1e-6, torch.ones(1, 2), torch.zeros(1, 2), torch.zeros(1, 4, dtype=torch.int32), 9,
            torch.float32)
    with pytest.raises(ValueError, match="kv must be fp32"):
        compress_decode(torch.zeros(1, 8), kv, *args)
    with pytest.raises(ValueError, match="position_bias must be"):
        compress_decode(kv, kv, *args[:2], torch.zeros(3, 16), *args[3:])
