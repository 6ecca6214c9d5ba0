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
from v4serve.model.fusion import fuse_fp8_rows, fuse_rows, widths
from v4serve.model.kernels import UsesKernels
from v4serve.ops.grouped_matmul import grouped_matmul
from v4serve.ops.moe_combine import moe_combine
from v4serve.ops.moe_route import moe_route
from v4serve.ops.moe_sort import moe_sort
from v4serve.ops.swiglu import clamped_swiglu


class Router(UsesKernels, nn.Module):
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

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor,
                route_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, D] -> (expert ids [T, k] long, weights [T, k] fp32): the logits GEMM, then `route`."""
        return self.route(self.logits(x), token_ids, route_rows)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x Wg^T [T, E] in x's dtype (cuBLAS; a one-launch Triton GEMV measured 8.1 against cuBLAS's
        6.0 µs for its split-K GEMM and reduction at decode, session 12, and was removed)."""
        return F.linear(x, self.weight)

    def route(self, logits: torch.Tensor, token_ids: torch.Tensor,
              route_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One routing op (`ops/moe_route.py`: scores, top-k or hash table, normalised scaled weights).
        `route_rows` [T]: token t is routed as token route_rows[t] (ForwardBatch.route_rows)."""
        if hasattr(self, "tid2eid"):
            table = dict(tid2eid=self.tid2eid, token_ids=token_ids)
        else:
            table = dict(bias=self.e_score_correction_bias)
        return moe_route(logits, self.top_k, self.scoring_func, self.normalize, self.scaling, rows=route_rows,
                         impl=self.impl, **table)


class RoutedExperts(UsesKernels, nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        e, d, i = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        self.limit = config.swiglu_limit
        self.gate_up_proj = nn.Parameter(torch.zeros(e, 2 * i, d))
        self.down_proj = nn.Parameter(torch.zeros(e, d, i))
        # V4.1 (FP4 experts), as its reference runs them: what the GEMMs see of their inputs
        # (`v41_quant.act_quant`; None: as is), and the routing weight applied to the fp32 SwiGLU
        # output before the down projection (its input rounding then sees the weighted values).
        self.act_quant = None
        self.weight_before_down = False

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                add: torch.Tensor | None = None) -> torch.Tensor:
        """Picks sorted by expert (`moe_sort`), two grouped matmuls around the clamped SwiGLU, then
        each token sums its k weighted picks (`moe_combine`, which also adds `add`, the shared
        expert's output). No host synchronisation (group sizes stay on the device), so decode can
        be graph-captured. A selection may repeat an expert (hash tables can): each pick contributes."""
        rows, ends, pos = moe_sort(experts, self.gate_up_proj.shape[0], impl=self.impl)
        q = self.act_quant or (lambda t: t)
        gate, up = grouped_matmul(q(x), self.gate_up_proj, rows, ends, impl=self.impl).chunk(2, dim=-1)
        if self.weight_before_down:
            sorted_weights = torch.empty_like(weights.flatten())
            sorted_weights[pos] = weights.flatten()
            hidden = clamped_swiglu(gate.float(), up.float(), self.limit, impl=self.impl) * sorted_weights[:, None]
            hidden, weights = hidden.to(x.dtype), torch.ones_like(weights)
        else:
            hidden = clamped_swiglu(gate, up, self.limit, impl=self.impl)
        hidden = q(hidden)
        y = grouped_matmul(hidden, self.down_proj, None, ends, impl=self.impl)  # hidden is already in pick order
        return moe_combine(y, pos, weights, add, impl=self.impl)


class SharedExpert(UsesKernels, nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, i = config.hidden_size, config.moe_intermediate_size * config.n_shared_experts
        self.limit = config.swiglu_limit
        self.gate_proj = nn.Linear(d, i, bias=False)
        self.up_proj = nn.Linear(d, i, bias=False)
        self.down_proj = nn.Linear(i, d, bias=False)
        self.gate_up = None  # gate_proj and up_proj as one FP8Linear once fused (`fuse_gate_up`)

    def fuse_gate_up(self) -> None:
        """FP8 gate_proj and up_proj (V4 / V4-Pro checkpoints) as one FP8Linear over their stacked
        codes and scales (`fusion.fuse_fp8_rows`), which runs them and the SwiGLU together
        (`fp8_linear_swiglu`: at decode one launch instead of three, the same bits). Nothing
        changes where they are not FP8 or round their input first (V4.1's pre-hooks)."""
        self.gate_up = fuse_fp8_rows([self.gate_proj, self.up_proj])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            return self.down_proj(self.gate_up.swiglu(x, self.limit))
        return self.finish(self.gate_proj(x), self.up_proj(x))

    def finish(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return self.down_proj(clamped_swiglu(gate, up, self.limit, impl=self.impl))


class MoE(UsesKernels, nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        # Layers past the main stack (the MTP layer) route by score.
        hashed = layer < len(config.mlp_layer_types) and config.mlp_layer_types[layer] == "hash_moe"
        self.gate = Router(config, hashed=hashed)
        self.experts = RoutedExperts(config)
        self.shared_experts = SharedExpert(config)
        self.register_buffer("input_proj", None, persistent=False)  # [router; shared gate; shared up] once fused
        self.prefetch_next = None  # model/expert_prefetch.py: the next layer's offloaded experts, guessed from x

    def fuse_projections(self) -> None:
        """One GEMM for the three projections of the input (router logits, shared gate and up)."""
        members = [self.gate, self.shared_experts.gate_proj, self.shared_experts.up_proj]
        self.input_proj, self._input_widths = fuse_rows(members), widths(members)
        if self.input_proj is None:  # FP8 shared expert: its gate and up as one GEMM with the SwiGLU
            self.shared_experts.fuse_gate_up()

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor, route_rows: torch.Tensor | None = None
                ) -> torch.Tensor:
        if self.input_proj is None:
            experts, weights = self.gate(x, token_ids, route_rows)
            shared = self.shared_experts(x)
        else:
            logits, gate, up = F.linear(x, self.input_proj).split(self._input_widths, dim=-1)
            experts, weights = self.gate.route(logits, token_ids, route_rows)
            shared = self.shared_experts.finish(gate, up)
        if self.prefetch_next is not None:
            self.prefetch_next(x, token_ids, route_rows)
        return self.experts(x, experts, weights, add=shared)
