"""Speculative decoding on the GPU (not yet run on a GPU when written): float32 activations, so
that the verify rows (prefill kernels) and plain decode steps (decode kernels, CUDA graphs) agree
on every argmax; a forced-correct draft and a partly-correct one, k = 1..4, both cache dtypes. In
bf16 the two kernel families round differently and greedy tokens may part at near-ties, as in any
engine whose verify and decode paths differ."""

from __future__ import annotations

import pytest
import torch

from v4serve.engine import Engine, EngineArgs, SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = [list(range(10, 10 + n)) for n in (5, 70, 33)]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)] * 3


class _Draft:
    def __init__(self, expected, wrong):
        self.expected, self.wrong, self.steps = expected, wrong, 0

    def propose(self, items, k):
        out = []
        for item in items:
            n = len(item.request.output_token_ids)
            d = list(self.expected[item.request.request_id][n:n + k])
            if self.wrong and d:
                # Wrong at position steps % (k + 1), i.e. every (k + 1)-th step all right: with
                # `% k`, k = 1 made every draft wrong (0 accepted, the failure seen on the H200).
                j = self.steps % (k + 1)
                if j < len(d):
                    d[j] = (d[j] + 1) % 1000
            out.append((d, None))
        self.steps += 1
        return out


def _run(engine):
    for i, (p, s) in enumerate(zip(PROMPTS, PARAMS)):
        engine.add_request(str(i), p, s)
    done = {}
    while engine.has_unfinished():
        for o in engine.step():
            if o.finished:
                done[o.request_id] = o.outputs[0].token_ids
    return done


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "auto"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_gpu_speculative_greedy_equals_plain(kv_cache_dtype, k):
    # Packed rows: the indexer's keys are fp4, so many keys score alike and the top-8 pick among them
    # follows 1-ulp differences of the score sums, which differ between the verify step (c (k + 1)
    # query rows) and a plain step (c rows): seen on the H200 at k = 4 (tokens parted mid-run; the
    # CPU, one kernel family, matches). index_topk 64 keeps every compressed row of these prompts
    # (<= 94 tokens / 4), so the packed run checks the speculative path, not the order of fp32 sums.
    overrides = ({"head_dim": 192, "qk_rope_head_dim": 64, "index_head_dim": 128, "index_topk": 64}
                 if kv_cache_dtype == "auto" else None)
    common = dict(model="tiny", device="cuda", dtype="float32", max_num_seqs=4, kv_cache_dtype=kv_cache_dtype,
                  hf_overrides=overrides, progress=False)
    plain = _run(Engine(EngineArgs(**common)))
    for wrong in (False, True):
        engine = Engine(EngineArgs(**common, speculative_config={"method": "mtp", "num_speculative_tokens": k}))
        engine.spec.drafter = _Draft(plain, wrong)
        assert _run(engine) == plain
        assert engine.spec.verify_runner.uses_cuda_graphs and engine.spec.device_steps > 0
        m = engine.spec.metrics
        if wrong:
            assert 0 < m.num_accepted_tokens < m.num_draft_tokens, m
        else:
            assert m.num_accepted_tokens == m.num_draft_tokens > 0, m


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("k", [1, 3])
def test_gpu_verify_graphs_match_their_eager_run(k):
    """The speculative steps replayed as CUDA graphs (verify; commit + MTP draft) against the same
    steps run eagerly (cuda_graphs=False): the same drafts after every step, the same tokens, the
    plain engine's tokens."""
    common = dict(model="tiny", device="cuda", dtype="float32", max_num_seqs=4, progress=False)
    plain = _run(Engine(EngineArgs(**common)))
    runs = {}
    for graphs in (True, False):
        engine = Engine(EngineArgs(**common, cuda_graphs=graphs,
                                   speculative_config={"method": "mtp", "num_speculative_tokens": k}))
        assert engine.spec.verify_runner.uses_cuda_graphs == graphs
        for i, (p, s) in enumerate(zip(PROMPTS, PARAMS)):
            engine.add_request(str(i), p, s)
        done, drafts = {}, []
        while engine.has_unfinished():
            for o in engine.step():
                if o.finished:
                    done[o.request_id] = o.outputs[0].token_ids
            drafts.append({rid: list(d) for rid, (d, _) in engine.spec._drafts.items()})
        runs[graphs] = (done, drafts, engine.spec.device_steps)
    assert runs[True][0] == runs[False][0] == plain
    assert runs[True][1] == runs[False][1] and runs[True][2] == runs[False][2] > 0
