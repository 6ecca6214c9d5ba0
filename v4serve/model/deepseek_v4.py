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

from v4serve.cache import ForwardBatch, PagedKVCache
from v4serve.config import ModelConfig
from v4serve.model.attention import Attention
from v4serve.model.mhc import HyperConnection, HyperHead
from v4serve.model.moe import MoE
from v4serve.model.norm import RMSNorm
from v4serve.model.rope import RopeTables, StepRope


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(config, layer)
        self.mlp = MoE(config, layer)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn_hc = HyperConnection(config)
        self.ffn_hc = HyperConnection(config)

    def forward(
        self, streams: torch.Tensor, batch: ForwardBatch, cache: PagedKVCache, rope: StepRope
    ) -> torch.Tensor:
        y, post, comb = self.attn_hc(streams, batch.kernels, batch.tickets)
        out = self.self_attn(self.input_layernorm(y, batch.kernels), batch, cache, rope)
        streams = HyperConnection.expand(out, streams, post, comb, batch.kernels)
        y, post, comb = self.ffn_hc(streams, batch.kernels, batch.tickets)
        out = self.mlp(self.post_attention_layernorm(y, batch.kernels), batch.token_ids, batch.kernels,
                       batch.route_rows)
        return HyperConnection.expand(out, streams, post, comb, batch.kernels)

    def forward_lagged(
        self, streams: torch.Tensor, pre_in: torch.Tensor, batch: ForwardBatch, cache: PagedKVCache, rope: StepRope
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DeepSeek-V4.1's lagged mHC: each sublayer collapses its input with the `pre` the previous
        sublayer computed (`pre_in`: the previous block's ffn `pre`, one-hot for layer 0) and hands
        its own on. Returns (streams, this block's ffn `pre`)."""
        k = batch.kernels
        a_pre, post, comb = self.attn_hc.coefficients(streams, k, batch.tickets)
        y = HyperConnection.collapse(streams, pre_in, k)
        out = self.self_attn(self.input_layernorm(y, k), batch, cache, rope)
        streams = HyperConnection.expand(out, streams, post, comb, k)
        f_pre, post, comb = self.ffn_hc.coefficients(streams, k, batch.tickets)
        y = HyperConnection.collapse(streams, a_pre, k)
        out = self.mlp(self.post_attention_layernorm(y, k), batch.token_ids, k, batch.route_rows)
        return HyperConnection.expand(out, streams, post, comb, k), f_pre


class DeepseekV4Model(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.hc_mult = config.hc_mult
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hc_head = HyperHead(config)


class DeepseekV4ForCausalLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = DeepseekV4Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._rope: RopeTables | None = None  # fp32 frequency tables, built on the weights' device

    def fuse_projections(self) -> None:
        """Once the weights are in place: every layer runs the projections that share an input as
        one GEMM (`model/fusion.py`)."""
        for layer in self.model.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def rope(self) -> RopeTables:
        device = self.lm_head.weight.device
        if self._rope is None or self._rope.main.device != device:
            self._rope = RopeTables(self.config, device)
        return self._rope

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: PagedKVCache) -> torch.Tensor:
        """Run one step; return fp32 logits [len(batch.logits_indices), vocab]."""
        x = self.model.embed_tokens(batch.token_ids)
        streams = x.unsqueeze(1).expand(-1, self.model.hc_mult, -1).contiguous()
        rope = self.rope().at(batch.positions)
        for layer in self.model.layers:
            streams = layer(streams, batch, cache, rope)
        if not batch.is_decode:  # a decode step wants every token's logits
            streams = streams[batch.logits_indices]
        h = self.model.norm(self.model.hc_head(streams, batch.kernels, batch.tickets), batch.kernels)
        return self.lm_head(h).float()
