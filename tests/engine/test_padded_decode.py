"""Padded decode steps: a step of n sequences replayed in a graph of size > n gets padding rows
pointed at the cache's padding slot and routed in the MoE as live rows. The live rows' tokens and
logprobs are those of unpadded steps, and the padding adds no expert to the step.

CUDA graphs need a GPU; here each "graph" is replayed by running the runner's forward at its
size on the same static buffers, which is what a replay computes."""

from __future__ import annotations

import torch

from v4serve.engine import Engine, EngineArgs, SamplingParams
from v4serve.engine.decode_runner import padded_route_rows
from v4serve.model.moe import Router

torch.set_num_threads(1)

PROMPTS = [list(range(10, 10 + n)) for n in (5, 33, 18)]


class EagerReplay:
    """Stands in for a captured CUDA graph of `size` rows: replay() recomputes its logits."""

    def __init__(self, runner, size: int):
        self.runner, self.size = runner, size

    def replay(self) -> None:
        logits = self.runner._forward(self.size)
        self.runner._graphs[self.size][1].copy_(logits)


def _generate(padded_size: int | None):
    # Prefix caching off: its page-sized prefill chunks would end the 33-token prompt with a
    # one-token decode-path step (one live row padded to 4) beside the 3-live-row steps checked below.
    engine = Engine(EngineArgs(model="tiny", device="cpu", dtype="float32", max_num_seqs=4, progress=False,
                               enable_prefix_caching=False))
    runner = engine.decode_runner
    if padded_size is not None:
        vocab = engine.config.vocab_size
        runner._graphs[padded_size] = (EagerReplay(runner, padded_size), torch.zeros(padded_size, vocab))
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=1)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                completion = out.outputs[0]
                outputs[out.request_id] = (completion.token_ids, [lp[t].logprob for lp, t in
                                                                 zip(completion.logprobs, completion.token_ids)])
    return outputs


def test_padded_route_rows():
    assert padded_route_rows(3, 3) == [0, 1, 2]
    assert padded_route_rows(3, 8) == [0, 1, 2, 0, 1, 2, 0, 1]
    assert padded_route_rows(1, 4) == [0, 0, 0, 0]


def test_padding_rows_change_no_live_row_and_add_no_expert(monkeypatch):
    unpadded = _generate(None)
    routes = []
    route = Router.route

    def recording_route(self, logits, token_ids, route_rows=None):
        experts, weights = route(self, logits, token_ids, route_rows)
        routes.append((experts.clone(), None if route_rows is None else route_rows.clone()))
        return experts, weights

    monkeypatch.setattr(Router, "route", recording_route)
    padded = _generate(4)
    assert padded.keys() == unpadded.keys()
    for rid, (tokens, logprobs) in unpadded.items():
        assert padded[rid][0] == tokens
        assert max(abs(a - b) for a, b in zip(padded[rid][1], logprobs)) < 1e-4
    padded_steps = [(experts, rows) for experts, rows in routes if rows is not None and experts.shape[0] == 4]
    assert padded_steps, "no decode step ran padded"
    for experts, rows in padded_steps:
        assert rows.tolist() == [0, 1, 2, 0]
        assert torch.equal(experts[3], experts[0])  # the padding row reuses row 0's experts
