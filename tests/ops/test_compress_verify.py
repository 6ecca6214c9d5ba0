"""A verify step's compressor steps in one call (`compress_verify`): the Triton kernel (interpreted
on the CPU) against the torch reference (per-group decode steps, then the state rows copied), and
against G launches of the decode kernel, bit for bit: rows, targets, final states and the states
saved after every group (the rollback's checkpoints)."""

import pytest
import torch

from v4serve.ops.compress_decode import compress_decode
from v4serve.ops.compress_verify import compress_verify


def _state(overlap, slots, ratio, d):
    if overlap:
        kv = torch.randn(slots, 2 * ratio, 2 * d)
        return kv, torch.randn_like(kv)
    return torch.randn(slots, d), torch.rand(slots, d) + 1, torch.randn(slots, d)


def _step(overlap, ratio, d=32, S=3, G=4, seed=0):
    """Inputs of one verify step: S sequences at positions that complete blocks in different groups."""
    gen = torch.manual_seed(seed)
    width = (2 if overlap else 1) * d
    slots = torch.tensor([4, 0, 2])[:S]
    starts = torch.tensor([ratio - 1, 2 * ratio - 3, 5])[:S]  # complete in group 0, group 2, none / late
    positions = (starts[None, :] + torch.arange(G)[:, None]).reshape(-1)
    rows_of = torch.arange(S * 8, dtype=torch.int32).view(S, 8).repeat(G, 1)
    rows_of[:, 1] = -1  # block 1 has no pool row: its row goes to scratch
    angles = (positions + 1 - ratio).float()[:, None] * torch.linspace(0.01, 1, 4)[None]
    return dict(kv=torch.randn(G * S, width, generator=gen), score=torch.randn(G * S, width, generator=gen) * 2,
                positions=positions, slots=slots, position_bias=torch.randn(ratio, width, generator=gen), ratio=ratio,
                norm_weight=torch.rand(d, generator=gen) + 0.5, eps=1e-6, cos=angles.cos(), sin=angles.sin(),
                rows_of=rows_of, scratch=99, out_dtype=torch.bfloat16), _state(overlap, 6, ratio, d)


@pytest.mark.parametrize("overlap,ratio", [(True, 4), (False, 8)])
def test_compress_verify_matches_reference_and_decode_steps(overlap, ratio):
    G, S = 4, 3
    inputs, state0 = _step(overlap, ratio, G=G, S=S)
    n = len(state0)
    results = {}
    for impl in ("torch", "triton"):
        state = tuple(t.clone() for t in state0)
        saved = torch.full((G, 8 * n, *state0[0].shape[1:]), float("nan"))
        rows, target = compress_verify(**inputs, state=state, groups=G, saved=saved, impl=impl)
        results[impl] = rows, target, state, saved
    # G launches of the decode kernel, the states copied after each: what the verify path did before
    decode_state = tuple(t.clone() for t in state0)
    steps, saved = [], []
    for g in range(G):
        at = slice(g * S, (g + 1) * S)
        group = {k: (v[at] if k in ("kv", "score", "positions", "cos", "sin", "rows_of") else v) for k, v in inputs.items()}
        steps.append(compress_decode(**group, state=decode_state, impl="triton"))
        saved.append(torch.stack([t[inputs["slots"]] for t in decode_state], 1).flatten(0, 1))
    rows, target, state, got_saved = results["triton"]
    assert torch.equal(rows, torch.cat([r for r, _ in steps])) and torch.equal(target, torch.cat([t for _, t in steps]))
    assert all(torch.equal(a, b) for a, b in zip(state, decode_state))
    assert torch.equal(got_saved[:, :S * n], torch.stack(saved))
    assert got_saved[:, S * n:].isnan().all()  # rows of sequences past S untouched
    ref_rows, ref_target, ref_state, ref_saved = results["torch"]
    assert torch.equal(target, ref_target)
    assert (target != 99).sum() >= 1 and (target == 99).sum() >= 1  # a block written, others to scratch
    torch.testing.assert_close(rows.float(), ref_rows.float(), rtol=1e-2, atol=1e-2)
    for got, want in zip(state, ref_state):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_saved[:, :S * n], ref_saved[:, :S * n], rtol=1e-5, atol=1e-5)
    # the saved states differ between groups (each is its own checkpoint)
    assert not torch.equal(got_saved[0, :S * n], got_saved[G - 1, :S * n])


def test_compress_verify_refuses_bad_groups():
    inputs, state = _step(True, 4, G=4)
    with pytest.raises(ValueError, match="groups"):
        compress_verify(**inputs, state=state, groups=3)


# ---- GPU, full shapes: the production kernels, bit for bit against G decode launches ----
_GPU_CASES = {  # (overlap, ratio, d, packed row format, hadamard): Flash's CSA, indexer keys, HCA
    "csa": (True, 4, 512, "fp8_e8m0_b64_rope64", False),
    "index": (True, 4, 128, "fp4_e8m0_b32", True),
    "hca": (False, 128, 512, "fp8_e8m0_b64_rope64", False),
}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", list(_GPU_CASES))
def test_gpu_compress_verify_equals_decode_launches(case):
    from v4serve.formats import row_format

    overlap, ratio, d, fmt, rotate = _GPU_CASES[case]
    S, G, slots_total = 8, 4, 16
    gen = torch.Generator().manual_seed(ratio * d)
    width = (2 if overlap else 1) * d
    slots = torch.randperm(slots_total, generator=gen)[:S].cuda()
    starts = torch.randint(0, 4 * ratio, (S,), generator=gen)
    starts[0] = ratio - 1  # completes a block in group 0
    positions = (starts[None, :] + torch.arange(G)[:, None]).reshape(-1).cuda()
    rows_of = torch.arange(S * 8, dtype=torch.int32).view(S, 8).repeat(G, 1).cuda()
    angles = (positions + 1 - ratio).float()[:, None] * torch.linspace(0.01, 1, 32, device="cuda")[None]
    inputs = dict(kv=torch.randn(G * S, width, generator=gen).cuda(),
                  score=(torch.randn(G * S, width, generator=gen) * 2).cuda(), positions=positions, slots=slots,
                  position_bias=torch.randn(ratio, width, generator=gen).cuda(), ratio=ratio,
                  norm_weight=(torch.rand(d, generator=gen) + 0.5).cuda(), eps=1e-6, cos=angles.cos(),
                  sin=angles.sin(), rows_of=rows_of, scratch=S * 8, out_dtype=torch.bfloat16, hadamard=rotate)
    f = row_format(fmt)
    row_bytes = -(-f.row_bytes(d) // 16) * 16
    n = 2 if overlap else 3
    state0 = (torch.randn(n, slots_total, 2 * ratio, width, generator=gen) if overlap else
              torch.stack([torch.randn(slots_total, d, generator=gen), torch.rand(slots_total, d, generator=gen) + 1,
                           torch.randn(slots_total, d, generator=gen)])).cuda()
    out = {}
    for way in ("verify", "decode"):
        stacked = state0.clone()
        state = tuple(stacked)
        pool = torch.zeros(S * 8 + 1, row_bytes, dtype=torch.uint8, device="cuda")
        if way == "verify":
            saved = torch.full((G, S * n, *state0.shape[2:]), float("nan"), device="cuda")
            rows, target = compress_verify(**inputs, state=state, groups=G, saved=saved, pool=pool, row_format=fmt)
        else:
            got, saved = [], []
            for g in range(G):
                at = slice(g * S, (g + 1) * S)
                group = {k: (v[at] if k in ("kv", "score", "positions", "cos", "sin", "rows_of") else v)
                         for k, v in inputs.items()}
                got.append(compress_decode(**group, state=state, pool=pool, row_format=fmt))
                saved.append(stacked[:, slots].transpose(0, 1).flatten(0, 1))
            rows, target, saved = torch.cat([r for r, _ in got]), torch.cat([t for _, t in got]), torch.stack(saved)
        out[way] = rows, target, stacked, saved, pool[:S * 8]  # the scratch row's last write depends on order
    for a, b in zip(out["verify"], out["decode"]):
        assert torch.equal(a, b)
    assert (out["verify"][1] != S * 8).any()  # some block completed and was written
