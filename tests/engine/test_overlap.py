"""Overlapped decoding (step N+1 launched before step N's tokens are read) changes nothing that
is observable: the same tokens, texts and finish reasons as stepping one at a time, also when
requests finish at different steps, stop on a token, or are aborted while a step is in flight."""

from __future__ import annotations

import pytest
import torch

from v4serve.engine import Engine, EngineArgs, SamplingParams

torch.set_num_threads(1)

PROMPTS = [list(range(10, 10 + n)) for n in (3, 40, 17, 70)]


def _params():
    return [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0.9, top_k=50, seed=7, max_tokens=30, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True, stop=["e"]),
        SamplingParams(temperature=1.0, seed=3, max_tokens=6, ignore_eos=True),
    ]


def _run(overlap: bool, abort_after: int | None = None):
    engine = Engine(EngineArgs(model="tiny", device="cpu", max_num_seqs=4, overlap_decode=overlap, progress=False))
    for i, (prompt, params) in enumerate(zip(PROMPTS, _params())):
        engine.add_request(str(i), prompt, params)
    finished, steps = {}, 0
    while engine.has_unfinished():
        outs = engine.step()
        steps += 1
        if abort_after is not None and steps == abort_after:
            engine.abort("1")
        for out in outs:
            if out.finished:
                finished[out.request_id] = (out.outputs[0].token_ids, out.outputs[0].text, out.outputs[0].finish_reason)
    assert engine.cache.allocator.num_used == 0 and engine.cache.num_free_slots == 4
    return finished, engine.decode_continuations


@pytest.mark.parametrize("abort_after", [None, 6])
def test_overlap_is_invisible(abort_after):
    serial, continued_serial = _run(overlap=False, abort_after=abort_after)
    overlapped, continued = _run(overlap=True, abort_after=abort_after)
    assert continued_serial == 0 and continued > 0  # the overlapped run did continue steps
    if abort_after is None:
        assert serial == overlapped
        assert {r for r, (_, _, why) in serial.items() if why == "length"} >= {"0", "1", "3"}
    else:
        assert "1" not in serial and "1" not in overlapped
        assert serial == overlapped


def test_one_token_prefill_chunks_are_not_continued():
    """With a budget of one token, prompts advance one token per step through the decode path but
    sample nothing until their last token: such steps must not be continued."""
    runs = {}
    for overlap in (False, True):
        engine = Engine(EngineArgs(model="tiny", device="cpu", max_num_seqs=1, max_num_batched_tokens=1,
                                   overlap_decode=overlap, progress=False))
        engine.add_request("a", PROMPTS[1][:12], SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))
        while engine.has_unfinished():
            for out in engine.step():
                if out.finished:
                    runs[overlap] = out.outputs[0].token_ids
    assert runs[True] == runs[False] and len(runs[True]) == 8
