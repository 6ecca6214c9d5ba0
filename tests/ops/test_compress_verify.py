"""A verify step's compressor steps in one call (`compress_verify`): the Triton kernel (interpreted
on the CPU) against the torch reference and against G launches of the decode kernel, bit for bit:
rows, targets and final states; and its undo journal by what matters: a commit
(`ops/state_commit.py`) to any accepted prefix restores the state the decode launches had after
that group."""

import pytest
import torch

from v4serve.ops.compress_decode import compress_decode
from v4serve.ops.compress_verify import compress_verify
from v4serve.ops.state_commit import StateCommit


def _state(overlap, slots, ratio, d):
    if overlap:
        kv = torch.randn(slots, 2 * ratio, 2 * d)
        return torch.stack((kv, torch.randn_like(kv)))
    return torch.stack((torch.randn(slots, d), torch.rand(slots, d) + 1, torch.randn(slots, d)))


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


def _decode_launches(inputs, stacked, G, S):
    """G launches of the decode kernel on `stacked` (in place): their rows, targets and the state
    after each group [G, n, slots, ...]."""
    steps, after = [], []
    for g in range(G):
        at = slice(g * S, (g + 1) * S)
        group = {k: (v[at] if k in ("kv", "score", "positions", "cos", "sin", "rows_of") else v)
                 for k, v in inputs.items()}
        steps.append(compress_decode(**group, state=tuple(stacked), impl="triton"))
        after.append(stacked.clone())
    return torch.cat([r for r, _ in steps]), torch.cat([t for _, t in steps]), torch.stack(after)


def _overwritten(position, ratio, overlap):
    """The sub-rows a decode step at `position` writes, written out: the open row r + j and, when
    the block completes, the previous block's rows 0 .. r - 1 (online: its one row)."""
    if not overlap:
        return {0}
    j = position % ratio
    return {ratio + j} | (set(range(ratio)) if j == ratio - 1 else set())


# G = 6 > r = 4: groups that rewrite an open row another group wrote, two blocks completed in a step;
# d = 320: the pooling kernel's channel slices (128 a program: two full, one partial)
@pytest.mark.parametrize("overlap,ratio,G,d", [(True, 4, 4, 32), (False, 8, 4, 32), (True, 4, 6, 32),
                                               (True, 4, 4, 320), (False, 8, 3, 320)])
def test_compress_verify_matches_decode_steps_and_commits_restore_each_group(overlap, ratio, G, d):
    S, max_rows = 3, 4
    inputs, state0 = _step(overlap, ratio, d=d, G=G, S=S)
    n = state0.shape[0]
    rows, target, after = _decode_launches(inputs, state0.clone(), G, S)
    want_written = [[sum(1 << x for x in _overwritten(int(inputs["positions"][g * S + b]), ratio, overlap))
                     for b in range(S)] for g in range(1, G)]
    slots = inputs["slots"]
    for impl in ("torch", "triton"):
        stacked = state0.clone()
        saved = torch.full((G, max_rows * n, *state0.shape[2:]), float("nan"))
        written = torch.full((G, max_rows), -1, dtype=torch.int32)
        got_rows, got_target = compress_verify(**inputs, state=tuple(stacked), groups=G, saved=saved,
                                               written=written, impl=impl)
        assert torch.equal(got_target, target), impl
        if impl == "triton":  # the reference rounds at the same points; the kernel is bit-exact
            assert torch.equal(got_rows, rows)
            assert torch.equal(stacked, after[G - 1])
        else:
            torch.testing.assert_close(got_rows.float(), rows.float(), rtol=1e-2, atol=1e-2)
            torch.testing.assert_close(stacked, after[G - 1], rtol=1e-5, atol=1e-5)
        assert written[:G - 1, :S].tolist() == want_written, impl
        assert (written[:, S:] == -1).all() and (written[G - 1] == -1).all()  # rows past S, the last group: untouched
        # every accepted prefix, all sequences alike and mixed, through both commit paths
        for accepted in [[a] * S for a in range(G)] + [[2, 0, G - 1][:S]]:
            for commit_impl in ("torch", "triton"):
                live = stacked.clone()
                StateCommit([live], [saved], [written], impl=commit_impl)(
                    slots, torch.tensor(accepted))
                for b, (slot, a) in enumerate(zip(slots.tolist(), accepted)):
                    if impl == "triton":
                        assert torch.equal(live[:, slot], after[a][:, slot]), (impl, commit_impl, accepted, b)
                    else:
                        torch.testing.assert_close(live[:, slot], after[a][:, slot], rtol=1e-5, atol=1e-5)
                others = [s for s in range(state0.shape[1]) if s not in slots.tolist()]
                assert torch.equal(live[:, others], stacked[:, others])  # slots outside the step untouched
    assert (target != 99).sum() >= 1 and (target == 99).sum() >= 1  # a block written, others to scratch
    assert not torch.equal(after[0], after[G - 1])  # the groups' states differ: the commits choose among them


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
@pytest.mark.parametrize("S", [1, 8])
@pytest.mark.parametrize("case", list(_GPU_CASES))
def test_gpu_compress_verify_equals_decode_launches(case, S):
    """c = S sequences, k = 3: rows, targets, packed pool rows and final states bit for bit against
    G decode launches, and the commit to every accepted prefix bit for bit against their states.
    The pooling runs over 4 channel slices of one warp (CSA, HCA) or one slice of 4 warps (indexer),
    the finish at 4 warps (d 512) or 1 (d 128): `launch_warps`' claim that they add as the decode
    kernel does."""
    from v4serve.formats import row_format

    overlap, ratio, d, fmt, rotate = _GPU_CASES[case]
    G, slots_total = 4, 16
    gen = torch.Generator().manual_seed(ratio * d + S)
    width = (2 if overlap else 1) * d
    slots = torch.randperm(slots_total, generator=gen)[:S].cuda()
    starts = torch.randint(0, 4 * ratio, (S,), generator=gen)
    starts[0] = ratio - 3 if overlap else ratio - 2  # completes a block inside the step, after group 0
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
            written = torch.zeros(G, S, dtype=torch.int32, device="cuda")
            rows, target = compress_verify(**inputs, state=state, groups=G, saved=saved, written=written, pool=pool,
                                           row_format=fmt)
        else:
            got, after = [], []
            for g in range(G):
                at = slice(g * S, (g + 1) * S)
                group = {k: (v[at] if k in ("kv", "score", "positions", "cos", "sin", "rows_of") else v)
                         for k, v in inputs.items()}
                got.append(compress_decode(**group, state=state, pool=pool, row_format=fmt))
                after.append(stacked.clone())
            rows, target = torch.cat([r for r, _ in got]), torch.cat([t for _, t in got])
        out[way] = rows, target, stacked, pool[:S * 8]  # the scratch row's last write depends on order
    for a, b in zip(out["verify"], out["decode"]):
        assert torch.equal(a, b)
    assert (out["verify"][1] != S * 8).any()  # some block completed and was written
    live = out["verify"][2]
    for accepted in [[a] * S for a in range(G)] + [torch.randint(0, G, (S,), generator=gen).tolist()]:
        restored = live.clone()
        StateCommit([restored], [saved], [written])(slots, torch.tensor(accepted, device="cuda"))
        for b, a in enumerate(accepted):
            assert torch.equal(restored[:, slots[b]], after[a][:, slots[b]]), (accepted, b)
