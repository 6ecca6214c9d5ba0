"""The DeepSeek-V4 causal LM: embedding -> hc_mult residual streams -> blocks -> hc head -> norm -> head.

Each block wraps attention and MoE in their own hyper-connection (see `mhc.py`):

    y = attn_hc.collapse(X);  X = attn_hc.expand(attention(input_layernorm(y)), X)
    y = ffn_hc.collapse(X);   X = ffn_hc.expand(moe(post_attention_layernorm(y)), X)

Module and parameter names follow transformers' `DeepseekV4ForCausalLM`, so a transformers
checkpoint loads by name; `weights.py` maps the official checkpoint's names onto them.
"""

from __future__ import annotations

import torch
from torch import nn

from v4serve.cache import ForwardBatch, LayerCache, PagedKVCache
from v4serve.config import ModelConfig
from v4serve.layer_plan import LayerPlan, ModelPlan, layer_plans
from v4serve.model.attention import Attention
from v4serve.model.kernels import bind_kernels
from v4serve.model.mhc import HyperConnection, HyperHead
from v4serve.model.moe import MoE
from v4serve.model.norm import RMSNorm
from v4serve.model.rope import RopeTables
from v4serve.model.step_plan import StepPlan, plan_step


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, plan: LayerPlan):
        super().__init__()
        self.self_attn = Attention(config, plan)
        self.mlp = MoE(config, plan.layer)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn_hc = HyperConnection(config)
        self.ffn_hc = HyperConnection(config)

    def forward(self, streams: torch.Tensor, batch: ForwardBatch, cache: LayerCache, step: StepPlan) -> torch.Tensor:
        y, post, comb = self.attn_hc(streams, batch.tickets)
        out = self.self_attn(self.input_layernorm(y), batch, cache, step)
        streams = self.attn_hc.expand(out, streams, post, comb)
        y, post, comb = self.ffn_hc(streams, batch.tickets)
        out = self.mlp(self.post_attention_layernorm(y), batch.token_ids, batch.route_rows)
        return self.ffn_hc.expand(out, streams, post, comb)


class DeepseekV4Model(nn.Module):
    def __init__(self, config: ModelConfig, plan: ModelPlan):
        super().__init__()
        self.hc_mult = config.hc_mult
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, p) for p in plan)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hc_head = HyperHead(config)


class DeepseekV4ForCausalLM(nn.Module):
    """The modules follow `plan` (default: `layer_plans(config)`); only its structure matters here
    (ratios, compressor kinds, indexer modes): row formats come with the cache's views."""

    def __init__(self, config: ModelConfig, plan: ModelPlan | None = None):
        super().__init__()
        self.config = config
        self.plan = plan if plan is not None else layer_plans(config)
        self.model = DeepseekV4Model(config, self.plan)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._rope: RopeTables | None = None  # fp32 frequency tables, built on the weights' device

    def bind_kernels(self, impl: str) -> "DeepseekV4ForCausalLM":
        """Every module's ops run `impl` ("auto", "torch" or "triton"; `model/kernels.py`)."""
        return bind_kernels(self, impl)

    def fuse_projections(self) -> None:
        """Once the weights are in place: every layer runs the projections that share an input as
        one GEMM (`model/fusion.py`)."""
        for layer in self.model.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def rope(self) -> RopeTables:
        device = self.lm_head.weight.device
        if self._rope is None or self._rope.main.device != device:
            self._rope = RopeTables(self.config, self.plan.ratios, device)
        return self._rope

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: PagedKVCache) -> torch.Tensor:
        """Run one step; return fp32 logits [len(batch.logits_indices), vocab]."""
        x = self.model.embed_tokens(batch.token_ids)
        streams = x.unsqueeze(1).expand(-1, self.model.hc_mult, -1).contiguous()
        step = plan_step(batch, self.rope())
        for i, layer in enumerate(self.model.layers):
            streams = layer(streams, batch, cache.view(i), step)
        if not batch.is_decode:  # a decode step wants every token's logits
            streams = streams[batch.logits_indices]
        h = self.model.norm(self.model.hc_head(streams, batch.tickets))
        return self.lm_head(h).float()
