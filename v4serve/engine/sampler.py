"""Turning next-token logits into tokens and logprobs.

Logprobs are those of the model's raw distribution (log_softmax of the logits), as vLLM reports
them; temperature, top-k and top-p shape only the distribution that is sampled from.
"""

from __future__ import annotations

import torch

from v4serve.engine.outputs import Logprob, PositionLogprobs
from v4serve.engine.sampling_params import SamplingParams


def sample_batch(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """One token per row of fp32 logits [N, V], on their device: int64 [N]. Greedy rows take the
    argmax in one op; sampled rows draw with their own request's generator (seeded requests
    reproduce whatever else is in the batch)."""
    tokens = torch.argmax(logits, dim=-1)
    for i, (p, g) in enumerate(zip(params, generators)):
        if not p.greedy:
            tokens[i] = sample(logits[i], p, g)
    return tokens


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One token from one row of fp32 logits [V], as a 0-d tensor on their device."""
    if params.greedy:
        return torch.argmax(logits)
    scaled = logits / params.temperature
    if params.top_k > 0 and params.top_k < scaled.numel():
        kth = torch.topk(scaled, params.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens strictly more likely than it already reach top_p.
        drop = (probs.cumsum(-1) - probs) >= params.top_p
        scaled = scaled.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = torch.softmax(scaled, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[0]


def position_logprobs(
    logprobs: torch.Tensor, token: int, top_n: int, decode: "callable[[int], str]"
) -> PositionLogprobs:
    """The top-N entries of one row of log-probabilities [V], plus `token` with its rank."""
    out: PositionLogprobs = {}
    if top_n > 0:
        values, ids = torch.topk(logprobs, top_n)
        for rank, (v, i) in enumerate(zip(values.tolist(), ids.tolist()), start=1):
            out[i] = Logprob(v, rank, decode(i))
    if token not in out:
        value = logprobs[token]
        rank = int((logprobs > value).sum()) + 1
        out[token] = Logprob(float(value), rank, decode(token))
    return out
