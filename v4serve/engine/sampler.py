"""Turning next-token logits into tokens and logprobs, for a whole batch at once.

Logprobs are those of the model's raw distribution (log_softmax of the logits), as vLLM reports
them; the bitmask, stop masks, logit bias, penalties, temperature, min_p, top-k and top-p shape
only the distribution that is drawn from (the tensor steps: sampler_ops.py).

Per step the host builds a few [B] parameter vectors (one copy each to the device) and sparse
(row, token) lists for `logit_bias` and the `min_tokens` masks; the device does the rest for every
row at once. Nothing reads a device value back: the sampler can follow a CUDA-graph replay and an
overlapped step (whose previous tokens only the device knows: `in_flight`).
"""

from __future__ import annotations

import torch

from v4serve.engine import sampler_ops as ops
from v4serve.engine.outputs import Logprob, PositionLogprobs
from v4serve.engine.sampler_penalties import TokenCounts, to_device
from v4serve.ops.token_bitmask import apply_token_bitmask


class Sampler:
    def __init__(self, vocab_size: int, num_slots: int, eos_token_ids: tuple[int, ...], device: torch.device):
        self.vocab_size = vocab_size
        self.eos_token_ids = tuple(eos_token_ids)
        self.device = device
        self.counts = TokenCounts(num_slots, vocab_size, device)

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        return to_device(values, dtype, self.device)

    def sample(self, logits: torch.Tensor, requests: list, in_flight: int = 0,
               pending: torch.Tensor | None = None, bitmask: torch.Tensor | None = None,
               must_end: set[int] = frozenset()) -> torch.Tensor:
        """One token per row of fp32 logits [B, V] (left unchanged) for `requests` (each with
        `params`, `seed`, `slot`, `prompt_token_ids`, `output_token_ids`): int64 [B] on the device.
        `in_flight` tokens per request were drawn on the device but are not in `output_token_ids`
        yet (`pending` [B]: those tokens); `bitmask` int32 [B, ceil(V/32)] on the device: the
        grammar's allowed tokens (all bits set on rows without a grammar); `must_end`: rows whose
        grammar allows only stop tokens, which `min_tokens` then does not mask."""
        x, penalized = self.process(logits, requests, in_flight, pending, bitmask, must_end)
        params = [r.params for r in requests]
        positions = [len(r.output_token_ids) + in_flight for r in requests]
        greedy = [p.greedy for p in params]
        if all(greedy):
            tokens = torch.argmax(x, dim=-1)
        else:
            tokens = self._draw(x, requests, params, positions)
            if any(greedy):
                tokens = torch.where(self._to_device(greedy, torch.bool), torch.argmax(x, dim=-1), tokens)
        if penalized is not None:
            rows, index, slots = penalized
            self.counts.add(rows, slots, tokens[index])
        return tokens

    def process(self, logits: torch.Tensor, requests: list, in_flight: int = 0,
                pending: torch.Tensor | None = None, bitmask: torch.Tensor | None = None,
                must_end: set[int] = frozenset()):
        """The logits [B, V] after the bitmask, stop masks, logit bias and penalties (what the
        greedy argmax and the temperature see), and the penalized rows' (requests, rows, slots)."""
        params = [r.params for r in requests]
        positions = [len(r.output_token_ids) + in_flight for r in requests]
        x = logits.clone() if bitmask is not None or any(_shapes(p) for p in params) else logits
        if bitmask is not None:
            apply_token_bitmask(x, bitmask)
        self._stop_masks(x, params, positions, must_end)
        self._bias(x, params)
        penalized = [i for i, p in enumerate(params) if p.penalized]
        if not penalized:
            return x, None
        rows = [requests[i] for i in penalized]
        slots = self.counts.rows(rows, in_flight, pending, penalized)
        index = self._to_device(penalized, torch.int64)
        vec = self._to_device([[params[i].repetition_penalty for i in penalized],
                               [params[i].frequency_penalty for i in penalized],
                               [params[i].presence_penalty for i in penalized]], torch.float32)
        x[index] = ops.apply_penalties(x[index], self.counts.counts[slots], self.counts.in_prompt[slots],
                                       vec[0], vec[1], vec[2])
        return x, (rows, index, slots)

    def _stop_masks(self, x: torch.Tensor, params: list, positions: list[int], must_end: set[int]) -> None:
        rows, tokens = [], []
        for i, (p, position) in enumerate(zip(params, positions)):
            if position < p.min_tokens and i not in must_end:
                stops = set(p.stop_token_ids) | (set() if p.ignore_eos else set(self.eos_token_ids))
                stops = [t for t in stops if t < self.vocab_size]
                rows += [i] * len(stops)
                tokens += stops
        if rows:
            ops.mask_tokens(x, self._to_device(rows, torch.int64), self._to_device(tokens, torch.int64))

    def _bias(self, x: torch.Tensor, params: list) -> None:
        rows, tokens, bias = [], [], []
        for i, p in enumerate(params):
            for t, b in p.logit_bias.items():
                rows.append(i)
                tokens.append(t)
                bias.append(b)
        if rows:
            ops.add_bias(x, self._to_device(rows, torch.int64), self._to_device(tokens, torch.int64),
                         self._to_device(bias, torch.float32))

    def _draw(self, x: torch.Tensor, requests: list, params: list, positions: list[int]) -> torch.Tensor:
        """Every row drawn (greedy rows too, at temperature 1: the caller takes their argmax)."""
        V = x.shape[1]
        vec = self._to_device([[p.temperature or 1.0 for p in params], [p.min_p for p in params],
                               [p.top_p for p in params]], torch.float32)
        u = self._to_device([ops.row_uniform(r.seed, pos) for r, pos in zip(requests, positions)], torch.float64)
        scaled = x / vec[0][:, None]
        if any(p.min_p > 0 for p in params):
            scaled = ops.apply_min_p(scaled, vec[1])
        if any(0 < p.top_k < V or p.top_p < 1 for p in params):
            top_k = self._to_device([p.top_k if 0 < p.top_k < V else V for p in params], torch.int64)
            scaled = ops.apply_top_k_top_p(scaled, top_k, vec[2])
        return ops.inverse_cdf_draw(scaled, u)


def _shapes(p) -> bool:
    """Whether a request changes the logits before the argmax (the raw logits are then copied)."""
    return p.penalized or bool(p.logit_bias) or p.min_tokens > 0


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
