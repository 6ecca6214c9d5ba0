"""The sampler's batched tensor steps: every function works on all rows at once, on the logits'
device, with per-row parameters as [B] tensors (no loop over rows, no host synchronisation).

Order (vLLM's): grammar bitmask -> min_tokens stop masks -> logit_bias -> penalties -> greedy
argmax | temperature -> min_p -> top-k -> top-p -> draw.

Draws are Gumbel-max with counter-based noise: the uniform for (row, token) is a hash of the row's
64-bit key (from its request's seed and output position, computed on the host) and the token id,
so a seeded request draws the same tokens whatever shares its batch, without a generator per row.

    u = (top 24 bits of mix64(key + token * GOLDEN) + 0.5) / 2**24
    token = argmax_t(scaled[t] - log(-log u[t]))   (masked logits are -inf and never win)
"""

from __future__ import annotations

import torch

_GOLDEN = 0x9E3779B97F4A7C15
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def mix64(x: int) -> int:
    """splitmix64's finaliser on a Python int (the host half of the noise: row keys)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * _M1) & _MASK64
    x = ((x ^ (x >> 27)) * _M2) & _MASK64
    return x ^ (x >> 31)


def row_key(seed: int, position: int) -> int:
    """The noise key of a request's `position`-th output token, as a signed int64."""
    return _signed(mix64(mix64(seed) + position * _GOLDEN))


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def uniform_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """u [B, V] fp32 in (0, 1) from int64 keys [B]; the device half of `mix64` (int64 products wrap)."""
    tokens = torch.arange(vocab, device=keys.device, dtype=torch.int64)
    x = keys[:, None] + tokens[None, :] * _signed(_GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(_M1)
    x = (x ^ _shr(x, 27)) * _signed(_M2)
    x = x ^ _shr(x, 31)
    return (_shr(x, 40).to(torch.float32) + 0.5) * (1.0 / 2**24)


def gumbel_draw(scaled: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """One token per row [B] int64 from temperature-scaled, masked logits [B, V]."""
    u = uniform_noise(keys, scaled.shape[1])
    return torch.argmax(scaled - torch.log(-torch.log(u)), dim=-1)


def mask_tokens(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> None:
    """logits[rows[i], tokens[i]] = -inf (min_tokens: stop tokens before the minimum)."""
    logits.index_put_((rows, tokens), torch.tensor(float("-inf"), device=logits.device, dtype=logits.dtype))


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
