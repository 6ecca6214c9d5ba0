"""Rejection sampling: the tokens it emits are distributed as the target's p, whatever the draft's q.

Chi-square goodness of fit on a 6-token vocabulary (5 degrees of freedom): the statistic must stay
below 20.52, the 99.9% quantile of chi2(5), with a fixed seed. A sampler that emitted the draft's
tokens unchecked (or resampled from p instead of max(0, p - q)) fails it by far (checked below).
"""

from __future__ import annotations

import torch

from v4serve.engine import Engine, EngineArgs, SamplingParams
from v4serve.engine.spec_decode import accept_greedy, accept_sampled, processed_probs

torch.set_num_threads(1)

V = 6
CHI2_999_DF5 = 20.52
TRIALS = 6000


def _chi2(tokens: list[int], p: torch.Tensor) -> float:
    counts = torch.bincount(torch.tensor(tokens), minlength=V).double()
    expected = p.double() * len(tokens)
    return float(((counts - expected) ** 2 / expected).sum())


def _dists(gen: torch.Generator, rows: int) -> torch.Tensor:
    return torch.softmax(torch.randn(rows, V, generator=gen) * 1.5, dim=-1)


def _emit(p: torch.Tensor, q: torch.Tensor | None, k: int, gen: torch.Generator, rule=accept_sampled):
    firsts, seconds = [], []
    for _ in range(TRIALS):
        if q is None:
            drafts = [(i + 2) % V for i in range(k)]  # fixed tokens: q = one-hot
        else:
            drafts = [int(torch.multinomial(q[i], 1, generator=gen)[0]) for i in range(k)]
        out = rule(p, drafts, q, gen)
        firsts.append(out[0])
        if len(out) > 1:
            seconds.append(out[1])
    return firsts, seconds


def test_emitted_tokens_follow_the_target():
    gen = torch.Generator().manual_seed(1234)
    p, q = _dists(gen, 4), _dists(gen, 3)  # k = 3 drafts: p has k + 1 rows
    firsts, seconds = _emit(p, q, 3, gen)
    assert _chi2(firsts, p[0]) < CHI2_999_DF5
    assert len(seconds) > TRIALS // 10 and _chi2(seconds, p[1]) < CHI2_999_DF5


def test_deterministic_drafts_follow_the_target():
    gen = torch.Generator().manual_seed(99)
    p = _dists(gen, 3)
    firsts, seconds = _emit(p, None, 2, gen)
    assert _chi2(firsts, p[0]) < CHI2_999_DF5
    assert _chi2(seconds, p[1]) < CHI2_999_DF5


def test_the_test_catches_a_wrong_rule():
    """Resampling from p itself after a rejection (instead of the residual) biases the output."""
    def wrong(p, drafts, q, gen):
        u = torch.rand((), generator=gen)
        if u < min(1.0, float(p[0, drafts[0]] / q[0, drafts[0]])):
            return [drafts[0]]
        return [int(torch.multinomial(p[0], 1, generator=gen)[0])]

    gen = torch.Generator().manual_seed(1234)
    p, q = _dists(gen, 2), _dists(gen, 1)
    firsts, _ = _emit(p, q, 1, gen, rule=wrong)
    assert _chi2(firsts, p[0]) > 3 * CHI2_999_DF5


def test_greedy_acceptance_is_the_longest_matching_prefix():
    logits = torch.full((4, V), -1.0)
    for row, best in enumerate((2, 4, 1, 5)):
        logits[row, best] = 1.0
    assert accept_greedy(logits, [2, 4, 1]) == [2, 4, 1, 5]
    assert accept_greedy(logits, [2, 3, 1]) == [2, 4]
    assert accept_greedy(logits, [0, 4, 1]) == [2]
    assert accept_greedy(logits[:1], []) == [2]


def test_processed_probs_is_the_samplers_distribution():
    """The engine's Sampler draws token = first index whose cumulative probability exceeds its
    uniform; the same uniforms through processed_probs' cumulative sums give the same tokens."""
    from types import SimpleNamespace

    from v4serve.engine.sampler import Sampler
    from v4serve.engine.sampler_ops import row_uniform

    logits = torch.randn(50, generator=torch.Generator().manual_seed(5)) * 3
    sampler = Sampler(50, 1, (), torch.device("cpu"))
    for params in (SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=5),
                   SamplingParams(temperature=0.9, top_p=0.6), SamplingParams(temperature=1.0, top_k=8, top_p=0.8),
                   SamplingParams(temperature=0.8, min_p=0.1)):
        probs = processed_probs(logits[None], params)[0].double()
        if params.top_k > 0 and params.top_p == 1.0:
            assert int((probs > 0).sum()) == params.top_k
        cdf = probs.cumsum(0)
        for seed in range(60):
            request = SimpleNamespace(params=params, seed=seed, slot=0, prompt_token_ids=[], output_token_ids=[])
            theirs = int(sampler.sample(logits[None].clone(), [request])[0])
            ours = int((cdf <= row_uniform(seed, 0) * float(cdf[-1])).sum())
            assert ours == theirs, (params, seed)


def test_seeded_speculative_sampling_reproduces():
    engine = Engine(EngineArgs(model="tiny", device="cpu", max_num_seqs=2, progress=False,
                               speculative_config={"method": "mtp", "num_speculative_tokens": 2}))

    def run(tag: str):
        engine.add_request(tag + "a", [3, 4, 5, 6], SamplingParams(temperature=0.8, top_k=20, seed=11, max_tokens=8,
                                                                     ignore_eos=True))
        engine.add_request(tag + "b", list(range(20, 60)), SamplingParams(temperature=1.0, seed=12, max_tokens=8,
                                                                          ignore_eos=True))
        out = {}
        while engine.has_unfinished():
            for o in engine.step():
                if o.finished:
                    out[o.request_id[1:]] = o.outputs[0].token_ids
        return out

    first, second = run("1"), run("2")
    assert first == second and engine.spec.metrics.num_draft_tokens > 0
    assert all(len(t) == 8 for t in first.values())
