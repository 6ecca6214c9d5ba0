"""Skewed expert use for the random-weight presets: router biases (and hash tables) drawn so that
the expected use of the experts follows a Zipf law, as trained routers are skewed.

Target. Rank the experts of a layer r = 1..E (a seeded random permutation per layer says which
expert has which rank); the share of the layer's picks that go to rank r is

    u_r = r^-a / sum_j j^-a                  (Zipf, exponent a; a = 0 is uniform)

so a token picks rank r with probability q_r = k u_r (k = num_experts_per_tok), which must stay
<= 1: ranks that would exceed it are held at Q_MAX and the rest renormalised (only for a >~ 1).

Score layers route by top-k(s + b) with s = sqrt(softplus(l)). For a preset's random router and
a token's MoE input x (RMS-normalised with unit weights, so |x|^2 = D), the logits l_e = x . W_e
are i.i.d. N(0, sigma^2) over the experts with sigma = init_std * sqrt(D) (W ~ N(0, init_std^2)).
The biases b solve P(e in top-k(s + b)) = q_e for scores with that law: start from the threshold
rule (e is picked iff s_e + b_e > 0, b_e = -Q(1 - q_e), Q the quantile function of s), then correct
on a fixed Monte Carlo sample of score rows, b_e -= Q(1 - q_e) - Q(1 - q_obs_e) (damped), until
the sample's pick rates match. Hash layers draw each token's k experts from u (without
replacement: Gumbel top-k over log u).

What the model then does with real hidden states is measured, not assumed: `use_summary` of the
counts of a calibration run (bench/engine.py reports it).
"""

from __future__ import annotations

import math

import torch

Q_MAX = 0.98  # highest per-token pick probability allowed to one expert
INIT_STD = 0.02  # the presets' random matrices (model/loader.py init_random_weights)


def zipf_pick_probability(n_experts: int, top_k: int, exponent: float) -> torch.Tensor:
    """q [E] (float64): per-token pick probability of each rank, sum = top_k, each <= Q_MAX."""
    u = torch.arange(1, n_experts + 1, dtype=torch.float64) ** -exponent
    q = top_k * u / u.sum()
    capped = torch.zeros(n_experts, dtype=torch.bool)
    while (q > Q_MAX + 1e-12).any():  # water-filling: capped ranks fixed, the rest share what is left
        capped |= q > Q_MAX
        rest = u * ~capped
        q = torch.where(capped, torch.full_like(q, Q_MAX), (top_k - Q_MAX * int(capped.sum())) * rest / rest.sum())
    return q


def _score_quantile(p: torch.Tensor, sigma: float) -> torch.Tensor:
    """Q(p) of s = sqrt(softplus(l)), l ~ N(0, sigma^2) (monotone in l)."""
    normal = torch.distributions.Normal(0.0, 1.0)
    logits = sigma * normal.icdf(p.clamp(1e-9, 1 - 1e-9))
    return torch.nn.functional.softplus(logits).sqrt()


def zipf_router_bias(n_experts: int, top_k: int, exponent: float, sigma: float, samples: int = 8192,
                     iterations: int = 25, seed: int = 0) -> torch.Tensor:
    """Biases [E] (float32, by rank) for which top-k(s + b) picks rank r with probability q_r."""
    q = zipf_pick_probability(n_experts, top_k, exponent)
    gen = torch.Generator().manual_seed(seed)
    scores = torch.nn.functional.softplus(sigma * torch.randn(samples, n_experts, generator=gen,
                                                              dtype=torch.float32)).sqrt().double()
    bias = -_score_quantile(1 - q, sigma)
    for _ in range(iterations):
        picked = torch.topk(scores + bias, top_k, dim=1).indices
        observed = torch.bincount(picked.flatten(), minlength=n_experts).double() / samples
        observed = observed.clamp(0.5 / samples, 1 - 0.5 / samples)
        bias -= 0.7 * (_score_quantile(1 - q, sigma) - _score_quantile(1 - observed, sigma))
    return bias.float()


def zipf_hash_table(vocab: int, n_experts: int, top_k: int, exponent: float, gen: torch.Generator) -> torch.Tensor:
    """tid2eid [vocab, k] by rank: k distinct ranks per token, drawn from the Zipf law."""
    log_u = -exponent * torch.log(torch.arange(1, n_experts + 1, dtype=torch.float32))
    gumbel = -torch.log(-torch.log(torch.rand(vocab, n_experts, generator=gen).clamp_(1e-20, 1.0)))
    return torch.topk(log_u + gumbel, top_k, dim=1).indices


@torch.no_grad()
def apply_zipf_routing(net: torch.nn.Module, config, exponent: float, seed: int = 0) -> list[torch.Tensor]:
    """Re-draw every router of a built model so expected expert use follows Zipf(exponent); returns
    each MoE layer's permutation (rank -> expert id), in layer order. exponent 0: uniform biases (0)
    and uniform hash tables."""
    from v4serve.model.moe import Router

    gen = torch.Generator().manual_seed(seed)
    e, k = config.n_routed_experts, config.num_experts_per_tok
    sigma = INIT_STD * math.sqrt(config.hidden_size)
    bias_by_rank = zipf_router_bias(e, k, exponent, sigma, seed=seed) if exponent else torch.zeros(e)
    permutations = []
    for router in (m for m in net.modules() if isinstance(m, Router)):
        expert_of_rank = torch.randperm(e, generator=gen)
        permutations.append(expert_of_rank)
        if hasattr(router, "tid2eid"):
            by_rank = zipf_hash_table(router.tid2eid.shape[0], e, k, exponent, gen)
            router.tid2eid.copy_(expert_of_rank[by_rank].to(router.tid2eid.device))
        else:
            bias = torch.empty(e)
            bias[expert_of_rank] = bias_by_rank
            router.e_score_correction_bias.copy_(bias.to(router.e_score_correction_bias.device))
    return permutations


def use_summary(counts: torch.Tensor) -> dict:
    """How skewed measured expert use is: counts [E] picks per expert of one layer (or [L, E]).
    Returns the share of picks of the hottest 10% of experts and the Zipf exponent fitted by least
    squares on log(count) against log(rank) over the experts picked at least once (averaged over
    layers)."""
    counts = counts.reshape(-1, counts.shape[-1]).double().cpu()
    shares, exponents = [], []
    for row in counts:
        if row.sum() == 0:
            continue
        ranked = row.sort(descending=True).values
        top = max(1, math.ceil(0.1 * row.numel()))
        shares.append(float(ranked[:top].sum() / ranked.sum()))
        live = ranked[ranked > 0]
        if live.numel() >= 2:
            x = torch.log(torch.arange(1, live.numel() + 1, dtype=torch.float64))
            y = torch.log(live)
            slope = ((x - x.mean()) * (y - y.mean())).sum() / ((x - x.mean()) ** 2).sum()
            exponents.append(float(-slope))
    mean = lambda v: sum(v) / len(v) if v else float("nan")  # noqa: E731
    return {"top10pct_share": round(mean(shares), 4), "zipf_exponent_fit": round(mean(exponents), 3),
            "layers": len(shares)}
