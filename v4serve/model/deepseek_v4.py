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

    def forward(self, streams: torch.Tensor, batch: ForwardBatch, cache: LayerCache, step: StepPlan,
                keep: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> torch.Tensor:
        """Output streams [T, hc, D]; with `keep` = (rows [R], their MoE routing rows or None), only
        those rows' [R, hc, D] (the attention still writes every token's KV rows: a draft pass that
        needs the cache of all its tokens and the output of a few)."""
        y, post, comb = self.attn_hc(streams, batch.tickets)
        out = self.self_attn(self.input_layernorm(y), batch, cache, step)
        streams = self.attn_hc.expand(out, streams, post, comb)
        token_ids, route_rows = batch.token_ids, batch.route_rows
        if keep is not None:
            rows, route_rows = keep
            streams, token_ids = streams.index_select(0, rows), token_ids.index_select(0, rows)
        y, post, comb = self.ffn_hc(streams, batch.tickets)
        out = self.mlp(self.post_attention_layernorm(y), token_ids, route_rows)
        return self.ffn_hc.expand(out, streams, post, comb)

    def forward_lagged(
        self, streams: torch.Tensor, pre_in: torch.Tensor, batch: ForwardBatch, cache: LayerCache, step: StepPlan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek-V4.1's lagged mHC: each sublayer collapses its input with the `pre` the previous
        sublayer computed (`pre_in`: the previous block's ffn `pre`, one-hot for layer 0) and hands
        its own on. Returns (streams, this block's ffn `pre`)."""
        a_pre, post, comb = self.attn_hc.coefficients(streams, batch.tickets)
        out = self.self_attn(self.input_layernorm(self.attn_hc.collapse(streams, pre_in)), batch, cache, step)
        streams = self.attn_hc.expand(out, streams, post, comb)
        f_pre, post, comb = self.ffn_hc.coefficients(streams, batch.tickets)
        out = self.mlp(self.post_attention_layernorm(self.ffn_hc.collapse(streams, a_pre)), batch.token_ids,
                       batch.route_rows)
        return self.ffn_hc.expand(out, streams, post, comb), f_pre


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

    def __init__(self, config: ModelConfig, plan: ModelPlan | None = None, mtp: bool = False):
        """`mtp`: build the checkpoint's MTP layers too (`mtp.N.*`, `model/mtp.py`; the draft of
        speculative decoding), `config.num_nextn_predict_layers` of them."""
        super().__init__()
        self.config = config
        self.plan = plan if plan is not None else layer_plans(config)
        self.model = DeepseekV4Model(config, self.plan)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if mtp:
            from v4serve.model.mtp import MTPLayer, mtp_layer_plan

            if config.num_nextn_predict_layers < 1:
                raise ValueError("the model has no MTP layer (config field `num_nextn_predict_layers` is 0)")
            self.mtp = nn.ModuleList(MTPLayer(config, mtp_layer_plan(self.plan, i))
                                     for i in range(config.num_nextn_predict_layers))
        self._rope: RopeTables | None = None  # fp32 frequency tables, built on the weights' device

    def bind_kernels(self, impl: str) -> "DeepseekV4ForCausalLM":
        """Every module's ops run `impl` ("auto", "torch" or "triton"; `model/kernels.py`)."""
        return bind_kernels(self, impl)

    def fuse_projections(self) -> None:
        """Once the weights are in place: every layer runs the projections that share an input as
        one GEMM (`model/fusion.py`)."""
        for layer in [*self.model.layers, *getattr(self, "mtp", ())]:
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
        return self.forward_with_streams(batch, cache)[0]

    @torch.inference_mode()
    def forward_with_streams(self, batch: ForwardBatch, cache: PagedKVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one step; return fp32 logits [len(batch.logits_indices), vocab] and the final residual
        streams of every token [T, hc_mult, D] (what the MTP layer reads)."""
        x = self.model.embed_tokens(batch.token_ids)
        streams = x.unsqueeze(1).expand(-1, self.model.hc_mult, -1).contiguous()
        step = plan_step(batch, self.rope())
        for i, layer in enumerate(self.model.layers):
            streams = layer(streams, batch, cache.view(i), step)
        picked = streams if batch.is_decode else streams[batch.logits_indices]  # decode: every token's logits
        h = self.model.norm(self.model.hc_head(picked, batch.tickets))
        return self.lm_head(h).float(), streams

    @torch.inference_mode()
    def forward_mtp(self, main_streams: torch.Tensor, batch: ForwardBatch, cache: PagedKVCache, index: int = 0,
                    keep: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """MTP layer `index` over `batch` (addressed in the MTP layer's own one-layer cache `cache`):
        `batch.token_ids` [T] are the tokens that follow the positions of `main_streams` [T, hc, D].
        Returns fp32 logits at `batch.logits_indices` and the layer's output streams [T, hc, D];
        with `keep` (a decode-style batch; see DecoderLayer.forward), logits and streams of those
        rows only, every row's KV written."""
        layer = self.mtp[index]
        step = plan_step(batch, self.rope())
        streams = layer(self.model.embed_tokens(batch.token_ids), main_streams, batch, cache.view(0), step, keep)
        picked = streams if batch.is_decode else streams[batch.logits_indices]
        return self.lm_head(layer.head_input(picked, batch)).float(), streams
