"""Speculative steps on the device (`engine/verify_runner.py`, what CUDA graphs replay; run eagerly
on the CPU): the verify batch's addressing against the window formula, greedy acceptance against
the host rule, the captured code free of capture-breaking ops, and the device rollback exact: a
partly-correct draft gives the plain engine's tokens *and logprobs*, and the same run with the
state commit switched off does not (the check can fail)."""

from __future__ import annotations

import pytest
import torch

from capture_guard import NoCaptureBreakingOps
from v4serve.cache.state_checkpoints import StateCheckpoints
from v4serve.engine import Engine, EngineArgs, SamplingParams
from v4serve.engine.spec_decode import greedy_tokens
from v4serve.engine.verify_runner import greedy_acceptance, verify_route_rows

torch.set_num_threads(1)

ARGS = dict(model="tiny", device="cpu", max_num_seqs=2, max_num_batched_tokens=64, progress=False)
# 37 and 20 tokens: decode runs through ratio-4 and ratio-16 block ends (tiny: window 32).
PROMPTS = [list(range(10, 47)), list(range(200, 220))]
PARAMS = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)


def _spec_engine(k: int) -> Engine:
    return Engine(EngineArgs(**ARGS, speculative_config={"method": "mtp", "num_speculative_tokens": k}))


def _run(engine: Engine) -> dict[str, tuple[list[int], float]]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, PARAMS)
    done = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = (out.outputs[0].token_ids, out.outputs[0].cumulative_logprob)
    return done


class _RightUpTo:
    """Drafts the plain run's tokens, the one at index `step % (k + 1)` wrong (k + 1: all right)."""

    def __init__(self, expected: dict[str, list[int]]):
        self.expected, self.steps = expected, 0

    def propose(self, items, k):
        out = []
        for item in items:
            n = len(item.request.output_token_ids)
            drafts = list(self.expected[item.request.request_id][n:n + k])
            j = self.steps % (k + 1)
            if j < len(drafts):
                drafts[j] = (drafts[j] + 1) % 500
            out.append((drafts, None))
        self.steps += 1
        return out


@pytest.fixture(scope="module")
def plain():
    return _run(Engine(EngineArgs(**ARGS)))


def _scripted(k: int, plain) -> Engine:
    engine = _spec_engine(k)
    engine.spec.drafter = _RightUpTo({rid: toks for rid, (toks, _) in plain.items()})
    return engine


def _same(a: dict, b: dict, tol: float = 1e-4) -> bool:
    return a.keys() == b.keys() and all(a[r][0] == b[r][0] and abs(a[r][1] - b[r][1]) < tol for r in a)


def test_device_steps_roll_back_exactly(plain):
    engine = _scripted(3, plain)
    assert _same(_run(engine), plain)
    m = engine.spec.metrics
    assert engine.spec.device_steps >= 4, "the verify runner must take the decode steps"
    assert 0 < m.num_accepted_tokens < m.num_draft_tokens
    assert all(n > 0 for n in m.accepted_per_position), m


def test_without_the_state_commit_the_output_differs(plain, monkeypatch):
    monkeypatch.setattr(StateCheckpoints, "commit", lambda self, accepted: None)
    engine = _scripted(3, plain)
    assert not _same(_run(engine), plain), "a rollback that keeps rejected tokens' states must show"


def test_verify_batch_addresses_each_tokens_window():
    engine = _spec_engine(2)
    cache = engine.cache
    w, ring = cache.page_size, cache.ring_size
    assert ring == w + 2
    starts, slots = torch.tensor([5, 40]), torch.tensor([1, 0])
    batch = cache.build_verify_batch(torch.arange(6), starts, slots, 3)
    assert batch.verify_groups == 3 and batch.is_decode
    for j in range(3):
        for b in range(2):
            t = j * 2 + b
            p, s = int(starts[b]) + j, int(slots[b])
            assert int(batch.positions[t]) == p and int(batch.slots[t]) == s
            window = [s * ring + q % ring if q >= 0 else -1 for q in range(p - w + 1, p + 1)]
            assert batch.window_columns[t].tolist() == window
            assert int(batch.staging_rows[t]) == s * ring + p % ring
    with pytest.raises(ValueError, match="rings"):
        cache.build_verify_batch(torch.arange(8), starts, slots, 4)


def test_checkpoints_restore_each_sequence_to_its_accepted_group():
    from v4serve.cache.geometry import CompressorShape
    from v4serve.cache.kv_cache import compressor_state

    states = [compressor_state(CompressorShape(4, 8, overlap), 5, "cpu") for overlap in (True, False)]
    checkpoints = StateCheckpoints(states, groups=3, max_rows=4)
    slots = torch.tensor([3, 0, 4])  # three sequences in a 4-row graph
    gen = torch.Generator().manual_seed(0)
    after = []  # every state tensor after each group, as the compressors would leave them
    checkpoints.begin(slots)
    for g in range(3):
        for state in states:
            for t in state.tensors():
                t.copy_(torch.randn(t.shape, generator=gen))
            checkpoints.save(state, g)
        after.append([t.clone() for state in states for t in state.tensors()])
    accepted = torch.tensor([2, 0, 1])
    checkpoints.commit(accepted)
    now = [t for state in states for t in state.tensors()]
    for i, t in enumerate(now):
        for b, slot in enumerate(slots.tolist()):
            assert torch.equal(t[slot], after[int(accepted[b])][i][slot])
        for other in (1, 2):  # slots outside the step keep their last values
            assert torch.equal(t[other], after[2][i][other])


def test_greedy_acceptance_matches_the_host_rule():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        k = int(torch.randint(1, 6, (1,), generator=gen))
        best = torch.randint(0, 3, (4, k + 1), generator=gen)
        tokens = torch.randint(0, 3, (4, k + 1), generator=gen)
        accepted = greedy_acceptance(tokens, best).tolist()
        for b in range(4):
            assert accepted[b] == len(greedy_tokens(best[b].tolist(), tokens[b, 1:].tolist())) - 1


def test_padding_rows_route_as_live_rows_of_their_group():
    rows = verify_route_rows(2, 4, 3)
    assert rows == [0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9]


def test_captured_halves_are_capture_safe(plain):
    engine = _scripted(2, plain)
    runner = engine.spec.verify_runner
    verify, after, checked = runner._verify, runner._commit_and_draft, []

    def guarded(fn):
        def run(*args):
            with NoCaptureBreakingOps():
                out = fn(*args)
            checked.append(fn.__name__)
            return out
        return run

    runner._verify, runner._commit_and_draft = guarded(verify), guarded(after)
    engine.spec.drafter = engine.spec.mtp  # the MTP draft runs inside the second half
    _run(engine)
    assert {"_verify", "_commit_and_draft"} <= set(checked)


def _drafts_per_step(engine: Engine) -> list[dict]:
    """Run the workload; the drafts held for the next step after every step."""
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True))
    seen = []
    while engine.has_unfinished():
        engine.step()
        seen.append({rid: list(d) for rid, (d, _) in engine.spec._drafts.items()})
    return seen


def test_device_mtp_drafts_equal_the_eager_drafters(monkeypatch):
    """The MTP draft inside the second half (first pass over the k + 1 positions, the kept row picked
    on the device, k - 1 decode steps) proposes what session 8's eager MTPDrafter proposes from the
    committed positions alone."""
    k = 3
    device = _spec_engine(k)
    device.spec.overlap = False  # each call's drafts are then its own step's (no step left in flight)
    device_drafts = _drafts_per_step(device)
    assert device.spec.device_steps >= 3
    monkeypatch.setattr(type(device.spec), "_full_drafts", lambda self, plan: None)  # every step eager
    eager = _spec_engine(k)
    assert _drafts_per_step(eager) == device_drafts and eager.spec.device_steps == 0
