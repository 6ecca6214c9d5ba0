"""Manifold-constrained hyper-connections (mHC): the residual stream is `hc_mult` parallel streams.

For one token with streams X [n, D] (n = hc_mult), each sublayer (attention, MoE) owns
`fn [(2+n)n, nD]`, `base [(2+n)n]`, `scale [3]`, and computes in float32:

    m      = (fn @ flatten(X)) * rsqrt(mean(flatten(X)^2) + rms_norm_eps)
    pre_j  = sigmoid(scale0 m[j] + base[j]) + hc_eps                  (collapse weights)
    post_j = 2 sigmoid(scale1 m[n+j] + base[n+j])                     (expand weights)
    C      = softmax_rows(scale2 m[2n:] + base[2n:]) + hc_eps, then column-normalised,
             then (hc_sinkhorn_iters - 1) rounds of row / column normalisation (Sinkhorn)

The sublayer f sees `y = sum_j pre_j X_j`; the new streams are `X'_k = post_k f(y) + sum_j C[j,k] X_j`.
The head collapses the final streams with its own `pre` (`hc_head_fn [n, nD]`, no post / comb).
"""

from __future__ import annotations

import torch
from torch import nn

from v4serve.config import ModelConfig
from v4serve.model.kernels import UsesKernels
from v4serve.ops.hc_collapse import hc_collapse
from v4serve.ops.hc_expand import hc_expand
from v4serve.ops.hc_expand_coefficients import hc_expand_coefficients
from v4serve.ops.hc_head_pre import hc_head_pre
from v4serve.ops.hc_stream_coefficients import hc_stream_coefficients


class HyperConnection(UsesKernels, nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        n = config.hc_mult
        self.hc_mult = n
        self.sinkhorn_iters = config.hc_sinkhorn_iters
        self.hc_eps = config.hc_eps
        self.rms_eps = config.rms_norm_eps
        self.fn = nn.Parameter(torch.zeros((2 + n) * n, n * config.hidden_size, dtype=torch.float32))
        self.base = nn.Parameter(torch.zeros((2 + n) * n, dtype=torch.float32))
        self.scale = nn.Parameter(torch.ones(3, dtype=torch.float32))

    def coefficients(self, streams: torch.Tensor, tickets: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(pre [T, n], post [T, n], comb [T, n, n]) fp32 of the streams: one op, one kernel on the
        GPU (`hc_stream_coefficients`): the mixes with the RMS factor (`hc_mix`; the factor is a
        per-token scalar, so it commutes with fn and the coefficients apply it), then the
        coefficients with Sinkhorn (`hc_coefficients`) in the mixer's epilogue. `tickets`: the
        step's zeroed counters (`ForwardBatch.tickets`) for the mixer's split reduction. The
        sublayer's input is then `collapse` with its own `pre` (V4) or the previous sublayer's
        (V4.1's lagged wiring, `LayerPlan.lagged_hc`)."""
        return hc_stream_coefficients(streams.flatten(1), self.fn, self.rms_eps, self.base, self.scale, self.hc_mult,
                                      self.sinkhorn_iters, self.hc_eps, tickets, impl=self.impl)

    def coefficients_after_expand(self, output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor,
                                  comb: torch.Tensor, tickets: torch.Tensor | None = None
                                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(X', pre, post, comb): the previous sublayer's `output` expanded into the streams with its
        post and comb (`expand`), then this sublayer's `coefficients` of X': one launch on the GPU
        (`hc_expand_coefficients`, the two ops' bits)."""
        return hc_expand_coefficients(output, streams, post, comb, self.fn, self.rms_eps, self.base, self.scale,
                                      self.hc_mult, self.sinkhorn_iters, self.hc_eps, tickets, impl=self.impl)

    def collapse(self, streams: torch.Tensor, pre: torch.Tensor, norm: nn.Module | None = None) -> torch.Tensor:
        """sum_j pre_j X_j -> [T, D] in streams.dtype; with `norm` (the sublayer's RMSNorm) normalised
        by it, in the same launch on the GPU."""
        if norm is None:
            return hc_collapse(streams, pre, impl=self.impl)
        return hc_collapse(streams, pre, norm.weight, norm.eps, impl=self.impl)

    def expand(self, output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
               ) -> torch.Tensor:
        """X'_k = post_k * output + sum_j comb[j, k] X_j  ->  [T, n, D] in streams.dtype (one kernel)."""
        return hc_expand(output, streams, post, comb, impl=self.impl)


class HyperHead(UsesKernels, nn.Module):
    """Final collapse of the streams before the model's norm and head."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        n = config.hc_mult
        self.hc_eps = config.hc_eps
        self.rms_eps = config.rms_norm_eps
        self.hc_fn = nn.Parameter(torch.zeros(n, n * config.hidden_size, dtype=torch.float32))
        self.hc_base = nn.Parameter(torch.zeros(n, dtype=torch.float32))
        self.hc_scale = nn.Parameter(torch.ones(1, dtype=torch.float32))

    def forward(self, streams: torch.Tensor, tickets: torch.Tensor | None = None, norm: nn.Module | None = None
                ) -> torch.Tensor:
        """pre_j = sigmoid(m[j] (rms scale) + base[j]) + hc_eps with m = hc_fn @ flatten(X) (`hc_head_pre`:
        one launch on the GPU); returns sum_j pre_j X_j [T, D] in streams.dtype, normalised by `norm`
        (the model's final RMSNorm) when given, in the collapse's launch on the GPU."""
        pre = hc_head_pre(streams.flatten(1), self.hc_fn, self.rms_eps, self.hc_base, self.hc_scale, self.hc_eps,
                          tickets, impl=self.impl)
        if norm is None:
            return hc_collapse(streams, pre, impl=self.impl)
        return hc_collapse(streams, pre, norm.weight, norm.eps, impl=self.impl)
