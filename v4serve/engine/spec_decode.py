"""Accepting draft tokens: greedy prefix matching and the rejection-sampling rule.

A verify step scores one sequence's last token and its k drafts d_1..d_k in one target forward:
row i of its logits is the target's next-token distribution p_i after d_1..d_i (row 0: after the
last committed token). What is emitted:

* greedy: the longest prefix of drafts with d_{i+1} == argmax p_i, then argmax p_a at the first
  mismatch a (or the bonus argmax p_k when all k match): a + 1 tokens, exactly the tokens greedy
  decoding without drafts would produce.
* sampled (Leviathan et al. / Chen et al. 2023): draft d_{i+1} was drawn from the draft's q_i;
  accept it with probability min(1, p_i(d) / q_i(d)); at the first rejection emit a token drawn from
  norm(max(0, p_i - q_i)) and stop; when all k are accepted emit a bonus token drawn from p_k. Every
  emitted token is then distributed exactly as the target's p (both p and q are the distributions
  after temperature / min_p / top-k / top-p: `processed_probs` below, over `sampler.shape_for_draw`).
  A draft given as a single token
  (no q: a deterministic draft) is q = one-hot(d).

Draws use a generator of the request's own (seeded from `Request.seed`), in a fixed order (one
uniform per draft, then one categorical draw), so seeded requests reproduce.
"""

from __future__ import annotations

import torch

from v4serve.engine.request import Request
from v4serve.engine.sampler import shape_for_draw


def generator_of(request: Request, device: torch.device) -> torch.Generator:
    """The request's generator for draft draws and rejection sampling, seeded from its `seed`
    (the engine's sampler draws from a counter; speculative draws keep their own order)."""
    if request.spec_generator is None:
        request.spec_generator = torch.Generator(device=device).manual_seed(request.seed % 2**63)
    return request.spec_generator


def accept_greedy(target_logits: torch.Tensor, drafts: list[int]) -> list[int]:
    """Tokens emitted for fp32 target logits [k+1, V] and k drafts (greedy)."""
    return greedy_tokens(torch.argmax(target_logits, dim=-1).tolist(), drafts)


def greedy_tokens(best: list[int], drafts: list[int]) -> list[int]:
    """Tokens emitted for the target's greedy token after each of the k + 1 rows (`best`) and k
    drafts: the drafts while they equal `best`, then best at the first mismatch (or the bonus)."""
    out = []
    for i, d in enumerate(drafts):
        if d != best[i]:
            break
        out.append(d)
    out.append(best[len(out)])
    return out


def accept_sampled(target_probs: torch.Tensor, drafts: list[int], draft_probs: torch.Tensor | None,
                   generator: torch.Generator | None) -> list[int]:
    """Tokens emitted for the target's processed probabilities [k+1, V], k drafts and the draft's
    probabilities [k, V] they were drawn from (None: deterministic drafts, q = one-hot)."""
    device = target_probs.device
    out = []
    for i, d in enumerate(drafts):
        p = target_probs[i]
        if draft_probs is None:
            q = torch.zeros_like(p)
            q[d] = 1.0
        else:
            q = draft_probs[i]
        u = torch.rand((), generator=generator, device=device)
        ratio = p[d] / q[d] if q[d] > 0 else torch.tensor(float("inf"), device=device)
        if u < torch.clamp(ratio, max=1.0):
            out.append(d)
            continue
        residual = torch.clamp(p - q, min=0.0)
        total = residual.sum()
        # p == q on their support leaves no residual mass; then p itself is the correct law.
        dist = residual / total if total > 0 else p
        out.append(int(torch.multinomial(dist, 1, generator=generator)[0]))
        return out
    out.append(int(torch.multinomial(target_probs[len(drafts)], 1, generator=generator)[0]))
    return out


def processed_probs(logits: torch.Tensor, params) -> torch.Tensor:
    """fp32 probabilities [N, V] that a sampled request draws from, every row under the same
    `params`: softmax of the sampler's own shaping (`sampler.shape_for_draw`: temperature, min_p,
    top-k, top-p). Logit bias, penalties, min_tokens masks and grammars are refused together with
    speculative decoding (`spec_config.check_request`), so nothing else shapes the rows."""
    return torch.softmax(shape_for_draw(logits.float(), [params] * logits.shape[0]), dim=-1)
