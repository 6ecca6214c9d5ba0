"""The bench-only forced-acceptance draft (`bench/forced_draft.py`): its schedule has the asked mean,
and on the tiny model the engine's own counters report that acceptance length while the output
stays the greedy reference."""

from __future__ import annotations

import pytest
import torch

from v4serve.bench.forced_draft import ForcedAcceptance, accepted_schedule
from v4serve.engine import Engine, EngineArgs, SamplingParams

torch.set_num_threads(1)


@pytest.mark.parametrize("length, k", [(2.0, 1), (2.0, 3), (2.8, 3), (3.5, 3), (1.0, 2)])
def test_schedule_has_the_mean_and_stays_in_range(length, k):
    counts = [accepted_schedule(length, n) for n in range(40)]
    assert all(0 <= a <= k for a in counts)
    assert sum(counts) / len(counts) == pytest.approx(length - 1, abs=1 / 40)


def test_lengths_past_k_plus_one_are_refused():
    with pytest.raises(ValueError, match="k \\+ 1"):
        ForcedAcceptance({}, 2, 3.5, 100)


def test_engine_reports_the_forced_length():
    args = EngineArgs(model="tiny", device="cpu", max_num_seqs=2, progress=False,
                      speculative_config={"method": "mtp", "num_speculative_tokens": 3})
    engine = Engine(args)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)

    def run():
        for i, n in enumerate((9, 21)):
            engine.add_request(str(i), list(range(30, 30 + n)), params)
        done = {}
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    done[out.request_id] = list(out.outputs[0].token_ids)
        return done

    reference = run()
    metrics = {}
    for overlap in (True, False):  # continuations filter the drafts on the device, the others on the host
        engine.spec.overlap, continuations = overlap, engine.spec.continuations
        engine.spec.metrics = type(engine.spec.metrics)()
        engine.spec.draft_filter = ForcedAcceptance(reference, 3, 2.8, engine.config.vocab_size)
        assert run() == reference
        metrics[overlap] = engine.spec.metrics
        assert (engine.spec.continuations > continuations) == overlap
    m = metrics[True]
    # The last steps draft fewer than k (max_tokens), so the mean drifts a little from 2.8.
    assert m.mean_acceptance_length == pytest.approx(2.8, abs=0.3), m
    assert m == metrics[False] and engine.spec.device_steps > 0


class _Stub:
    def __init__(self, request_id: str, prompt_len: int, produced: int):
        self.request_id, self.prompt_token_ids, self.output_token_ids = request_id, [0] * prompt_len, [0] * produced


def test_device_drafts_equal_the_host_drafts():
    """`on_device` (a continuation's drafts, before the host has read the previous step) gives what
    the host's call for the same proposal gives, from each row's start alone."""
    reference = {"a": list(range(100, 124)), "b": list(range(200, 210))}
    device, host = (ForcedAcceptance(reference, 3, 2.8, 500) for _ in range(2))
    produced = {"a": 1, "b": 1}
    prompt = {"a": 7, "b": 4}
    for step in range(8):
        requests = [_Stub(rid, prompt[rid], produced[rid]) for rid in ("a", "b")]
        starts = torch.tensor([prompt[r] + produced[r] - 1 for r in ("a", "b")])
        on_device = device.on_device(requests, torch.zeros(2, 3, dtype=torch.int64), starts).tolist()
        for request, row in zip(requests, on_device):
            expected = host(request, [])
            assert row[:len(expected)] == expected, (step, request.request_id)
            device(request, [])  # the stepper's host call for the same proposal comes after the launch
        produced = {"a": produced["a"] + 1 + step % 3, "b": produced["b"] + 1}
