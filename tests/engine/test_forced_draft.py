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
    engine.spec.metrics = type(engine.spec.metrics)()
    engine.spec.draft_filter = ForcedAcceptance(reference, 3, 2.8, engine.config.vocab_size)
    assert run() == reference
    m = engine.spec.metrics
    # The last steps draft fewer than k (max_tokens), so the mean drifts a little from 2.8.
    assert m.mean_acceptance_length == pytest.approx(2.8, abs=0.3), m
    assert engine.spec.device_steps > 0
