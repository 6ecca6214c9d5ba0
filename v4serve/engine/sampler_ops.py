"""The sampler's batched tensor steps: every function works on all rows at once, on the logits'
device, with per-row parameters as [B] tensors (no loop over rows, no host synchronisation).

Order (vLLM's): grammar bitmask -> min_tokens stop masks -> logit_bias -> penalties -> greedy
argmax | temperature -> min_p -> top-k -> top-p -> draw.

Draws invert the cumulative distribution at one uniform per row, a hash of the request's seed
and output position computed on the host, so a seeded request draws the same tokens whatever
shares its batch (and after a preemption), without a generator per row and without device noise:

    u = top 53 bits of mix64(mix64(seed) + position * GOLDEN) / 2**53
    token = min t such that sum_{s <= t} softmax(scaled)[s] > u * total
"""

from __future__ import annotations

import torch

_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser on a Python int."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return x ^ (x >> 31)


def row_uniform(seed: int, position: int) -> float:
    """The uniform in [0, 1) of a request's `position`-th draw: the top 53 bits of its key."""
    return (mix64(mix64(seed) + position * _GOLDEN) >> 11) * 2.0**-53


def inverse_cdf_draw(scaled: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row [B] int64 from temperature-scaled, masked logits [B, V] and a uniform per
    row u [B] in [0, 1): the first token whose cumulative probability exceeds u (a token of
    probability 0, masked, never is: the target stays below the total, which the last live token
    reaches)."""
    cdf = torch.softmax(scaled, dim=-1).cumsum(dim=-1)
    total = cdf[:, -1]
    target = torch.minimum(u.to(cdf.dtype) * total, torch.nextafter(total, torch.zeros_like(total)))
    # A row with nothing left (all -inf: NaN) must still give a token id in range.
    return torch.searchsorted(cdf, target[:, None], right=True)[:, 0].clamp_(max=scaled.shape[1] - 1)


def mask_tokens(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> None:
    """logits[rows[i], tokens[i]] = -inf (min_tokens: stop tokens before the minimum)."""
    logits.index_put_((rows, tokens), torch.full((len(rows),), float("-inf"), device=logits.device, dtype=logits.dtype))


def add_bias(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor, bias: torch.Tensor) -> None:
    """logits[rows[i], tokens[i]] += bias[i]."""
    logits.index_put_((rows, tokens), bias.to(logits.dtype), accumulate=True)


def apply_penalties(logits: torch.Tensor, counts: torch.Tensor, in_prompt: torch.Tensor,
                    repetition: torch.Tensor, frequency: torch.Tensor, presence: torch.Tensor) -> torch.Tensor:
    """vLLM's penalties on logits [P, V]: counts int32 [P, V] of each token in the output so far,
    in_prompt bool [P, V]; repetition / frequency / presence [P].

        seen = in_prompt | counts > 0
        x = seen ? (x > 0 ? x / r : x * r) : x
        x = x - f * counts - p * (counts > 0)
    """
    out_seen = counts > 0
    r = repetition[:, None]
    penalized = torch.where(logits > 0, logits / r, logits * r)
    logits = torch.where(in_prompt | out_seen, penalized, logits)
    return logits - frequency[:, None] * counts.to(logits.dtype) - presence[:, None] * out_seen.to(logits.dtype)


def apply_min_p(scaled: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop tokens whose probability is below min_p times the row's top probability."""
    probs = torch.softmax(scaled, dim=-1)
    keep = probs >= min_p[:, None] * probs.max(dim=-1, keepdim=True).values
    return scaled.masked_fill(~keep, float("-inf"))


def apply_top_k_top_p(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """top_k int64 [B] (V = off): keep tokens at least as likely as the k-th (ties kept); then top_p
    [B] (>= 1 = off): drop a token when the tokens strictly more likely than it already reach p."""
    sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
    kth = sorted_logits.gather(1, (top_k - 1).clamp(0, scaled.shape[1] - 1)[:, None])
    sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    probs = torch.softmax(sorted_logits, dim=-1)
    before = probs.cumsum(dim=-1) - probs
    threshold = torch.where(top_p >= 1, torch.full_like(top_p, float("inf")), top_p)
    sorted_logits = sorted_logits.masked_fill(before >= threshold[:, None], float("-inf"))
    return torch.empty_like(scaled).scatter_(1, order, sorted_logits)
