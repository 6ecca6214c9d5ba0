"""Mixture of experts: every layer's FFN.

    s   = score_fn(x Wg^T)                       sqrtsoftplus: sqrt(softplus(.))
    sel = top-k(s + bias)      (score layers)    |  tid2eid[token_id]   (hash layers)
    w   = s[sel] / sum(s[sel]) * routed_scaling_factor   (unbiased scores weight the experts)
    out = sum_{e in sel} w_e W2_e(silu(min(W1_e x, L)) * clamp(W3_e x, -L, L)) + shared(x)

with L = swiglu_limit. Routed experts are stored fused as transformers does:
`experts.gate_up_proj [E, 2I, D]` (W1 rows then W3 rows) and `experts.down_proj [E, D, I]`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from v4serve.config import ModelConfig
from v4serve.ops.grouped_matmul import grouped_matmul


def clamped_swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    return F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)


def _score(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    if scoring_func == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    if scoring_func == "sigmoid":
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)


class Router(nn.Module):
    """Expert selection and weights. Hash layers select by token id, score layers by biased score."""

    def __init__(self, config: ModelConfig, hashed: bool):
        super().__init__()
        self.top_k = config.num_experts_per_tok
        self.scoring_func = config.scoring_func
        self.scaling = config.routed_scaling_factor
        self.normalize = config.norm_topk_prob
        self.weight = nn.Parameter(torch.zeros(config.n_routed_experts, config.hidden_size))
        if hashed:
            self.register_buffer("tid2eid", torch.zeros(config.vocab_size, self.top_k, dtype=torch.long))
        else:
            self.register_buffer("e_score_correction_bias", torch.zeros(config.n_routed_experts, dtype=torch.float32))

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> (expert ids [T, k] long, weights [T, k] fp32)."""
        scores = _score(F.linear(x, self.weight).float(), self.scoring_func)
        if hasattr(self, "tid2eid"):
            experts = self.tid2eid[token_ids].long()
        else:
            experts = torch.topk(scores + self.e_score_correction_bias, self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, experts)
        if self.normalize:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return experts, weights * self.scaling


class RoutedExperts(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        e, d, i = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        self.limit = config.swiglu_limit
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, d))
        self.down_proj = nn.Parameter(torch.zeros(e, d, i))

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, kernels: str) -> torch.Tensor:
        """Picks sorted by expert, two grouped matmuls, then each token sums its k weighted picks.
        No host synchronisation (group sizes stay on the device), so decode can be graph-captured.
        A selection may repeat an expert (hash tables can): each pick contributes."""
        t, k = experts.shape
        flat = experts.flatten()
        order = torch.argsort(flat, stable=True)
        sizes = torch.zeros(self.gate_up_proj.shape[0], dtype=torch.int32, device=x.device)
        sizes.scatter_add_(0, flat.int(), torch.ones_like(flat, dtype=torch.int32))
        ends = sizes.cumsum(0, dtype=torch.int32)
        gate, up = grouped_matmul(x, self.gate_up_proj, order // k, ends, impl=kernels).chunk(2, dim=-1)
        hidden = clamped_swiglu(gate, up, self.limit).to(x.dtype)
        every = torch.arange(hidden.shape[0], device=x.device)
        y = grouped_matmul(hidden, self.down_proj, every, ends, impl=kernels)
        y = y * weights.flatten()[order, None]
        unsorted = torch.empty_like(y)
        unsorted[order] = y
        return unsorted.view(t, k, -1).sum(dim=1).to(x.dtype)


class SharedExpert(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, i = config.hidden_size, config.moe_intermediate_size * config.n_shared_experts
        self.limit = config.swiglu_limit
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(clamped_swiglu(self.gate_proj(x), self.up_proj(x), self.limit))


class MoE(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.gate = Router(config, hashed=config.mlp_layer_types[layer] == "hash_moe")
        self.experts = RoutedExperts(config)
        self.shared_experts = SharedExpert(config)

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor, kernels: str = "auto") -> torch.Tensor:
        experts, weights = self.gate(x, token_ids)
        return self.experts(x, experts, weights, kernels) + self.shared_experts(x)
