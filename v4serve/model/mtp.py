"""DeepSeek-V4's multi-token-prediction (MTP) layer: the draft model of speculative decoding.

For the main model's final residual streams `X_main[t]` ([T, hc_mult, D], before its hc head) and
the embedding of the token that follows position t (architecture reference §3, "MTP (V4)"):

    e = enorm(embed(next_ids))                  [T, D]      (the main model's embedding, shared)
    h = hnorm(X_main)                           [T, hc, D]  (RMSNorm per stream)
    X = e_proj(e)[:, None] + h_proj(h)          [T, hc, D]
    X = block(X)                                one decoder block: window-only attention (ratio 0,
                                                its own window cache), score-routed MoE, its own mHC
    logits = head(norm(hc_head(X)))             own hc head and norm, the main model's lm head

The block's output streams are returned too: a second draft step feeds them back as `X_main`
(one MTP layer drafting k tokens recursively, as vLLM and SGLang run V4's single MTP layer).

Parameter names: `mtp.N.{e_proj,h_proj,enorm,hnorm,norm}.weight`, `mtp.N.hc_head.hc_{fn,base,scale}`
and the block's tensors under `mtp.N.` in our (transformers-style) decoder-layer names
(`mtp.N.self_attn.q_a_proj.weight`, `mtp.N.mlp.experts.gate_up_proj`, ...: `MTPLayer` is a
`DecoderLayer` with the MTP parts added). The official
checkpoint's `mtp.N.<layer suffix>` / `mtp.N.hc_head_fn` map onto them (`official_names.py`).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from v4serve.cache import ForwardBatch, LayerCache
from v4serve.config import ModelConfig
from v4serve.layer_plan import CompressorKind, IndexerMode, LayerPlan, ModelPlan
from v4serve.model.deepseek_v4 import DecoderLayer
from v4serve.model.mhc import HyperHead
from v4serve.model.norm import RMSNorm
from v4serve.model.step_plan import StepPlan


def mtp_layer_plan(main: ModelPlan, index: int = 0) -> LayerPlan:
    """The MTP layer's plan: window only (ratio 0), layer id = main layers + index, the main
    layers' window row format."""
    first = main[0]
    return LayerPlan(
        layer=len(main) + index, ratio=0, compressor=CompressorKind.NONE, indexer=IndexerMode.NONE,
        kv_source=len(main) + index, head_dim=first.head_dim, index_head_dim=first.index_head_dim,
        window_format=first.window_format, compressed_format=None, index_format=None, packed=first.packed,
        q_head_rms=first.q_head_rms,
    )


def mtp_model_plan(main: ModelPlan, index: int = 0) -> ModelPlan:
    """A one-layer plan for the MTP layer's own (window-only) cache."""
    return dataclasses.replace(main, layers=(mtp_layer_plan(main, index),), token_history=0)


class MTPLayer(DecoderLayer):
    """A decoder block (window-only attention, score-routed MoE, its own mHC) plus the MTP input
    projections, norms and hc head."""

    def __init__(self, config: ModelConfig, plan: LayerPlan):
        super().__init__(config, plan)
        d = config.hidden_size
        self.enorm = RMSNorm(d, config.rms_norm_eps)
        self.hnorm = RMSNorm(d, config.rms_norm_eps)
        self.e_proj = nn.Linear(d, d, bias=False)
        self.h_proj = nn.Linear(d, d, bias=False)
        self.hc_head = HyperHead(config)
        self.norm = RMSNorm(d, config.rms_norm_eps)

    def forward(self, embedded: torch.Tensor, main_streams: torch.Tensor, batch: ForwardBatch, cache: LayerCache,
                step: StepPlan, keep=None) -> torch.Tensor:
        """Output streams [T, hc, D] of the block for `embedded` [T, D] (embedding of the next
        tokens) and `main_streams` [T, hc, D] (`keep`: only some rows', DecoderLayer.forward)."""
        x = self.e_proj(self.enorm(embedded))[:, None] + self.h_proj(self.hnorm(main_streams.to(embedded.dtype)))
        return super().forward(x.contiguous(), None, batch, cache, step, keep)[0]

    def head_input(self, streams: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """norm(hc_head(streams)) [T, D]: what the shared lm head reads."""
        return self.norm(self.hc_head(streams, batch.tickets))
