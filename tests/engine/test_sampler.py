"""The sampler on hand-made distributions."""

from __future__ import annotations

import math

import torch

from v4serve.engine.sampler import position_logprobs, sample
from v4serve.engine.sampling_params import SamplingParams

# Probabilities 0.4, 0.3, 0.2, 0.1, then tokens with almost nothing.
PROBS = torch.tensor([0.4, 0.3, 0.2, 0.1] + [1e-9] * 6)
LOGITS = PROBS.log()


def _draws(params: SamplingParams, n: int = 400) -> set[int]:
    gen = torch.Generator().manual_seed(0)
    return {int(sample(LOGITS, params, gen)) for _ in range(n)}


def test_greedy_takes_the_argmax():
    assert sample(LOGITS, SamplingParams(temperature=0.0), None) == 0


def test_top_k_and_top_p_restrict_the_support():
    assert _draws(SamplingParams(top_k=2)) == {0, 1}
    assert _draws(SamplingParams(top_p=0.65)) == {0, 1}  # 0.4 < 0.65 <= 0.7
    assert _draws(SamplingParams(top_p=0.4)) == {0}  # the top token alone reaches 0.4
    assert _draws(SamplingParams(top_p=0.95)) == {0, 1, 2, 3}


def test_temperature_sharpens():
    gen = torch.Generator().manual_seed(0)
    cold = [int(sample(LOGITS, SamplingParams(temperature=0.05), gen)) for _ in range(200)]
    assert cold.count(0) > 190


def test_position_logprobs_ranks():
    logprobs = torch.log_softmax(LOGITS, -1)
    out = position_logprobs(logprobs, token=3, top_n=2, decode=str)
    assert sorted(out) == [0, 1, 3]
    assert out[3].rank == 4 and math.isclose(out[3].logprob, math.log(0.1), abs_tol=1e-6)
    assert out[0].rank == 1 and out[0].decoded_token == "0"


def test_sample_batch_mixes_greedy_and_seeded_rows():
    from v4serve.engine.sampler import sample_batch

    logits = torch.stack([LOGITS, LOGITS.flip(0), LOGITS])
    params = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.0), SamplingParams(seed=4)]

    def seeded():
        return torch.Generator().manual_seed(4)

    tokens = sample_batch(logits, params, [None, None, seeded()])
    assert tokens[:2].tolist() == [0, 9]
    alone = sample_batch(logits[2:], params[2:], [seeded()])
    assert tokens[2] == alone[0]  # a seeded row draws the same token whatever shares its batch


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
