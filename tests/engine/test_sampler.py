"""The batched sampler against direct computations: each processing step is recomputed here token
by token in plain Python (the oracle), and the draws against the distribution they must follow."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest
import torch

from v4serve.engine.sampler import Sampler, position_logprobs
from v4serve.engine.sampling_params import SamplingParams

V = 50
EOS = (1,)


@dataclass(eq=False)
class Row:
    params: SamplingParams
    slot: int
    seed: int = 0
    prompt_token_ids: list[int] = field(default_factory=lambda: [3, 4, 4, 7])
    output_token_ids: list[int] = field(default_factory=list)


def _logits(b: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(b, V, generator=torch.Generator().manual_seed(seed)) * 3


def _sampler() -> Sampler:
    return Sampler(V, 8, EOS, torch.device("cpu"))


def _oracle(logits: list[float], row: Row, extra_output: list[int] = ()) -> list[float]:
    """vLLM's rules, one token at a time."""
    p = row.params
    out = list(row.output_token_ids) + list(extra_output)
    x = list(logits)
    if len(out) < p.min_tokens:
        for t in set(p.stop_token_ids) | (set() if p.ignore_eos else set(EOS)):
            x[t] = -math.inf
    for t, b in p.logit_bias.items():
        x[t] += b
    for t in range(V):
        count = out.count(t)
        if t in row.prompt_token_ids or count:
            x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
        x[t] -= p.frequency_penalty * count + p.presence_penalty * (count > 0)
    return x


PENALTY_CASES = [
    SamplingParams(repetition_penalty=1.7),
    SamplingParams(repetition_penalty=0.6),
    SamplingParams(frequency_penalty=0.9),
    SamplingParams(frequency_penalty=-1.3),
    SamplingParams(presence_penalty=1.5),
    SamplingParams(presence_penalty=-0.4),
    SamplingParams(logit_bias={0: 5.0, 9: -7.5, 49: 100.0}),
    SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5, presence_penalty=0.25, logit_bias={4: 2.0}),
    SamplingParams(),  # untouched
]


def test_each_penalty_and_logit_bias_match_a_direct_computation():
    sampler = _sampler()
    rows = [Row(p, slot=i, output_token_ids=[5, 5, 9, 3, 40, 5][: i + 1]) for i, p in enumerate(PENALTY_CASES[:8])]
    rows.append(Row(PENALTY_CASES[8], slot=7, output_token_ids=[2]))
    logits = _logits(len(rows))
    got, _ = sampler.process(logits, rows)
    for i, row in enumerate(rows):
        assert torch.allclose(got[i], torch.tensor(_oracle(logits[i].tolist(), row)), atol=1e-5), PENALTY_CASES[i]
    assert torch.equal(got[8], logits[8])


def test_counts_follow_the_device_tokens_of_overlapped_steps_and_rebuild_on_a_new_request():
    sampler = _sampler()
    a = Row(SamplingParams(temperature=0.0, frequency_penalty=1.0, repetition_penalty=1.5), slot=2,
            output_token_ids=[6])
    logits = _logits(1, seed=1)
    first = sampler.sample(logits, [a])  # greedy; the host does not append it (still "in flight")
    got, _ = sampler.process(logits, [a], in_flight=1, pending=first)
    assert torch.allclose(got[0], torch.tensor(_oracle(logits[0].tolist(), a, [int(first)])), atol=1e-5)
    # The slot is reused by another request: its counts start from its own tokens.
    b = Row(SamplingParams(presence_penalty=2.0), slot=2, prompt_token_ids=[0], output_token_ids=[11, 11])
    got, _ = sampler.process(logits, [b])
    assert torch.allclose(got[0], torch.tensor(_oracle(logits[0].tolist(), b)), atol=1e-5)
    # A dropped in-flight row (the host never appended it) is noticed and rebuilt.
    sampler.sample(logits, [b])
    got, _ = sampler.process(logits, [b])
    assert torch.allclose(got[0], torch.tensor(_oracle(logits[0].tolist(), b)), atol=1e-5)


def test_min_tokens_masks_eos_and_stop_ids_until_reached():
    sampler = _sampler()
    params = SamplingParams(min_tokens=3, stop_token_ids=[7, 8])
    rows = [Row(params, 0, output_token_ids=[2, 2]), Row(params, 1, output_token_ids=[2, 2, 2]),
            Row(SamplingParams(min_tokens=3, ignore_eos=True, stop_token_ids=[7]), 2)]
    logits = _logits(3)
    got, _ = sampler.process(logits, rows)
    for i, row in enumerate(rows):
        assert torch.equal(got[i], torch.tensor(_oracle(logits[i].tolist(), row)))
    assert got[0, [1, 7, 8]].eq(-math.inf).all() and torch.equal(got[1], logits[1])
    assert got[2, 7] == -math.inf and got[2, 1] == logits[2, 1]
    # An in-flight token counts towards the minimum.
    got, _ = sampler.process(logits[:1], rows[:1], in_flight=1, pending=torch.tensor([2]))
    assert torch.equal(got[0], logits[0])


def _frequencies(params: SamplingParams, logits: torch.Tensor, n: int = 6000) -> torch.Tensor:
    rows = [Row(params, 0, seed=s) for s in range(n)]
    tokens = _sampler().sample(logits.expand(n, -1).contiguous(), rows)
    return torch.bincount(tokens, minlength=logits.shape[-1]).double() / n


def _expected(logits: torch.Tensor, keep: list[int], temperature: float = 1.0) -> torch.Tensor:
    z = [math.exp(logits[t].item() / temperature) if t in keep else 0.0 for t in range(logits.shape[0])]
    return torch.tensor(z, dtype=torch.float64) / sum(z)


PROBS = torch.tensor([0.4, 0.3, 0.2, 0.1] + [1e-9] * 6)
LOGITS = PROBS.log()


@pytest.mark.parametrize("params, keep", [
    (SamplingParams(), list(range(10))),
    (SamplingParams(temperature=0.5), list(range(10))),
    (SamplingParams(top_k=2), [0, 1]),
    (SamplingParams(top_p=0.65), [0, 1]),  # 0.4 < 0.65 <= 0.7
    (SamplingParams(top_p=0.4), [0]),  # the top token alone reaches 0.4
    (SamplingParams(top_p=0.95), [0, 1, 2, 3]),
    (SamplingParams(min_p=0.3), [0, 1, 2]),  # 0.1 < 0.3 * 0.4 <= 0.2
    (SamplingParams(min_p=0.3, top_k=2), [0, 1]),
])
def test_draws_follow_the_shaped_distribution(params, keep):
    freq = _frequencies(params, LOGITS)
    expected = _expected(LOGITS, keep, params.temperature)
    assert set(torch.nonzero(freq).flatten().tolist()) <= set(keep)
    assert (freq - expected).abs().max() < 0.025, (freq, expected)


def test_greedy_rows_take_the_argmax_of_the_processed_logits():
    rows = [Row(SamplingParams(temperature=0.0), 0), Row(SamplingParams(temperature=0.0, logit_bias={9: 50.0}), 1),
            Row(SamplingParams(temperature=0.0, repetition_penalty=100.0), 2, prompt_token_ids=[0])]
    wide = torch.full((3, V), -30.0)
    wide[:, :10] = LOGITS
    tokens = _sampler().sample(wide, rows)
    assert tokens.tolist() == [0, 9, 1]


def test_seeded_rows_draw_the_same_tokens_whatever_shares_the_batch():
    logits = _logits(6, seed=3)
    params = SamplingParams(temperature=1.0)
    rows = [Row(params, i, seed=100 + i, output_token_ids=[0] * i) for i in range(6)]
    together = _sampler().sample(logits, rows)
    alone = [int(_sampler().sample(logits[i:i + 1], rows[i:i + 1])) for i in (5, 2, 0)]
    assert [together[i].item() for i in (5, 2, 0)] == alone
    # The next position of the same seed draws fresh noise.
    later = [Row(params, 0, seed=100, output_token_ids=[0] * k) for k in range(40)]
    assert len(set(_sampler().sample(logits[:1].expand(40, -1).contiguous(), later).tolist())) > 3


def test_position_logprobs_ranks():
    logprobs = torch.log_softmax(LOGITS, -1)
    out = position_logprobs(logprobs, token=3, top_n=2, decode=str)
    assert sorted(out) == [0, 1, 3]
    assert out[3].rank == 4 and math.isclose(out[3].logprob, math.log(0.1), abs_tol=1e-6)
    assert out[0].rank == 1 and out[0].decoded_token == "0"


@pytest.mark.parametrize("kwargs, name", [
    (dict(min_p=1.5), "min_p"), (dict(presence_penalty=3), "presence_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"), (dict(repetition_penalty=0), "repetition_penalty"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"), (dict(logit_bias={3: float("nan")}), "logit_bias"),
])
def test_bad_params_name_the_field(kwargs, name):
    with pytest.raises(ValueError, match=f"SamplingParams.{name}"):
        SamplingParams(**kwargs)


def test_incremental_detokenizer_matches_a_full_decode():
    from v4serve.engine.detokenizer import IncrementalDetokenizer
    from v4serve.tokenizer import Tokenizer

    tok = Tokenizer.for_model(None)
    text = "Grüße, 世界! 🙂🚀 naïve café — ∑x² <｜User｜> done"
    ids = tok.encode(text)
    for skip in (True, False):
        detok = IncrementalDetokenizer(tok, skip)
        pieces = [detok.append(t) for t in ids] + [detok.flush()]
        assert "".join(pieces) == detok.text == tok.decode(ids, skip)
    # A lone lead byte of a multi-byte character is held back until the request flushes.
    byte_tokens = [t for t in range(tok.vocab_size) if tok.decode([t]) == "\ufffd"][:1]
    detok = IncrementalDetokenizer(tok, True)
    assert detok.append(byte_tokens[0]) == ""
    assert detok.flush() == "\ufffd"


@pytest.mark.parametrize("u", [0.0, 0.5, 1 - 2**-53])
def test_a_masked_token_is_never_drawn_at_the_ends_of_the_uniform(monkeypatch, u):
    """Masked tokens (probability 0) sit before, between and after the live ones; the extreme
    uniforms must still land on a live token."""
    from v4serve.engine import sampler_ops as ops

    monkeypatch.setattr(ops, "row_uniform", lambda seed, position: u)
    logits = torch.full((2, V), float("-inf"))
    logits[0, [7, 9]] = torch.tensor([0.0, 30.0])
    logits[1, 9] = 1.0
    tokens = _sampler().sample(logits, [Row(SamplingParams(), 0), Row(SamplingParams(), 1)]).tolist()
    assert tokens[0] in (7, 9) and tokens[1] == 9
