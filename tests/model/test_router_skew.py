"""Zipf-skewed routing for the random presets: the pick probabilities (the formula), the fitted
router biases checked by routing fresh RMS-normalised inputs through random N(0, 0.02) routers
with the routing op (an independent sample, not the fit's), the hash tables, and the measured-use
summary against counts drawn from a known law."""

from __future__ import annotations

import math

import torch

from v4serve.model.deepseek_v4 import DeepseekV4ForCausalLM
from v4serve.model.moe import Router
from v4serve.model.router_skew import (apply_zipf_routing, use_summary, zipf_hash_table, zipf_pick_probability,
                                       zipf_router_bias)
from v4serve.ops.moe_route import moe_route
from v4serve.presets import preset_config


def test_pick_probability_is_zipf_capped_at_q_max():
    q = zipf_pick_probability(10, 2, 1.0)
    harmonic = sum(1 / r for r in range(1, 11))
    assert torch.allclose(q, torch.tensor([2 / r / harmonic for r in range(1, 11)], dtype=torch.float64))
    capped = zipf_pick_probability(256, 6, 1.3)  # rank 1 would get 6 * 0.38 > 1
    assert abs(capped.sum().item() - 6) < 1e-9 and capped.max().item() <= 0.98 + 1e-12
    assert torch.all(capped[1:] <= capped[:-1])
    assert torch.allclose(zipf_pick_probability(16, 4, 0.0), torch.full((16,), 0.25, dtype=torch.float64))


def test_fitted_biases_give_zipf_use_on_fresh_tokens():
    e, k, d, a = 64, 4, 1024, 1.0
    bias = zipf_router_bias(e, k, a, sigma=0.02 * math.sqrt(d), seed=1)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(8192, d, generator=g)
    x = x / x.pow(2).mean(-1, keepdim=True).sqrt()
    w = torch.randn(e, d, generator=g) * 0.02
    experts, _ = moe_route(x @ w.T, k, "sqrtsoftplus", True, 1.0, bias=bias, impl="torch")
    observed = torch.bincount(experts.flatten(), minlength=e).double() / x.shape[0]
    want = zipf_pick_probability(e, k, a)
    assert ((observed[:8] - want[:8]).abs() / want[:8]).max() < 0.15
    assert abs(use_summary(torch.bincount(experts.flatten(), minlength=e))["zipf_exponent_fit"] - a) < 0.1


def test_hash_tables_draw_distinct_experts_by_rank():
    table = zipf_hash_table(4000, 16, 3, 1.0, torch.Generator().manual_seed(0))
    assert table.shape == (4000, 3)
    assert all(len(set(row)) == 3 for row in table.tolist())
    share = torch.bincount(table.flatten(), minlength=16).double()
    assert share[0] > share[3] > share[15]


def test_apply_puts_each_layers_hottest_rank_on_its_permuted_expert():
    config = preset_config("tiny")
    net = DeepseekV4ForCausalLM(config)
    permutations = apply_zipf_routing(net, config, 1.0, seed=3)
    routers = [m for m in net.modules() if isinstance(m, Router)]
    assert len(permutations) == len(routers)
    for perm, router in zip(permutations, routers):
        if hasattr(router, "tid2eid"):
            counts = torch.bincount(router.tid2eid.flatten(), minlength=config.n_routed_experts)
            assert int(counts.argmax()) == int(perm[0])
        else:
            assert int(router.e_score_correction_bias.argmax()) == int(perm[0])
    apply_zipf_routing(net, config, 0.0)
    assert all(not r.e_score_correction_bias.any() for r in routers if not hasattr(r, "tid2eid"))


def test_use_summary_of_a_known_law():
    ranks = torch.arange(1, 101, dtype=torch.float64)
    counts = (1e6 * ranks**-1.2).round()
    summary = use_summary(counts[torch.randperm(100)])
    assert abs(summary["zipf_exponent_fit"] - 1.2) < 0.01
    assert abs(summary["top10pct_share"] - float(counts[:10].sum() / counts.sum())) < 1e-4
    assert use_summary(torch.full((2, 50), 7))["top10pct_share"] == 0.1
