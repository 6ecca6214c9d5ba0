"""The DeepSeek-V4 / V4.1 causal LM, one model whose blocks follow their `LayerPlan`:
embedding -> hc_mult residual streams -> blocks -> head collapse -> norm -> head.

Each block wraps attention and MoE in their own hyper-connection (see `mhc.py`); sublayer s
computes its coefficients (pre_s, post_s, comb_s) from the streams it receives and runs

    y = collapse(X, c_s);  X = expand_s(f_s(norm_s(y)), X)

where the collapse weights c_s are its own pre_s (V4) or, with the plan's `lagged_hc` (V4.1),
the pre of the sublayer before it (the previous block's ffn pre; one-hot on stream 0 before
the first block). A layer whose plan names an `engram_table` first adds that Engram table's
hashed n-gram embeddings to the streams (V4.1, `engram.py`). The model closes (`ModelPlan`)
with its own `hc_head` collapse and the head in the model dtype (V4), or with a collapse by the
last block's ffn pre and the head in fp32 (V4.1).

Module and parameter names follow transformers' `DeepseekV4ForCausalLM`, so a transformers
checkpoint loads by name; `official_names.py` maps the official V4 checkpoint's names onto them and
`v41_weights.py` the official V4.1 checkpoint's.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from v4serve.cache import ForwardBatch, LayerCache, PagedKVCache
from v4serve.config import ModelConfig
from v4serve.layer_plan import LayerPlan, ModelPlan, layer_plans
from v4serve.model.attention import Attention
from v4serve.model.engram import Engram
from v4serve.model.engram_hash import EngramHashTables, NgramHasher, engram_table_rows
from v4serve.model.kernels import UsesKernels, bind_kernels
from v4serve.model.mhc import HyperConnection, HyperHead
from v4serve.model.moe import MoE
from v4serve.model.norm import RMSNorm
from v4serve.model.rope import RopeTables
from v4serve.model.step_plan import StepPlan, plan_step
from v4serve.ops.hc_collapse import hc_collapse

FP8_DRAFT_HEAD_BLOCK = (128, 128)  # the MTP drafts' FP8 head (`add_fp8_draft_head`): the official FP8 blocks


class PendingExpand(NamedTuple):
    """A block's ffn output and the streams, post and comb it expands into (`HyperConnection.expand`),
    not yet expanded: the next block's first mixer runs the expand."""
    output: torch.Tensor
    streams: torch.Tensor
    post: torch.Tensor
    comb: torch.Tensor


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, plan: LayerPlan):
        super().__init__()
        self.lagged_hc = plan.lagged_hc
        self.engram_table = plan.engram_table
        self.engram = None if plan.engram_table is None else Engram(
            config, engram_table_rows(config)[plan.engram_table])
        self.self_attn = Attention(config, plan)
        self.mlp = MoE(config, plan.layer)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.attn_hc = HyperConnection(config)
        self.ffn_hc = HyperConnection(config)

    def forward(self, streams: torch.Tensor, pre_in: torch.Tensor | None, batch: ForwardBatch, cache: LayerCache,
                step: StepPlan, keep: tuple[torch.Tensor, torch.Tensor | None] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """streams [T, n, D] -> (streams, this block's ffn pre [T, n] fp32). `pre_in`: the previous
        sublayer's pre (read with `lagged_hc` only; None is fine otherwise). With `keep` = (rows [R],
        their MoE routing rows or None), only those rows' [R, n, D] and [R, n] (the attention still
        writes every token's KV rows: a draft pass that needs the cache of all its tokens and the
        output of a few)."""
        pending, f_pre = self.forward_deferred(streams, pre_in, batch, cache, step, keep)
        return self.ffn_hc.expand(*pending), f_pre

    def forward_deferred(self, streams: torch.Tensor | PendingExpand, pre_in: torch.Tensor | None,
                         batch: ForwardBatch, cache: LayerCache, step: StepPlan,
                         keep: tuple[torch.Tensor, torch.Tensor | None] | None = None
                         ) -> tuple[PendingExpand, torch.Tensor]:
        """`forward` without its last expand: (the ffn's output with the streams, post and comb it
        expands into, f_pre). `streams` may be the previous block's `PendingExpand`: its expand then
        runs in this block's first mixer launch (`coefficients_after_expand`), one launch a block
        fewer; the caller expands the last block's (`expand_pending`)."""
        if isinstance(streams, PendingExpand) and self.engram is None:
            streams, a_pre, post, comb = self.attn_hc.coefficients_after_expand(*streams, batch.tickets)
        else:
            if isinstance(streams, PendingExpand):
                streams = self.attn_hc.expand(*streams)
            if self.engram is not None:
                streams = self.engram(streams, step.engram_rows[self.engram_table])
            a_pre, post, comb = self.attn_hc.coefficients(streams, batch.tickets)
        y = self.attn_hc.collapse(streams, pre_in if self.lagged_hc else a_pre, self.input_layernorm)
        attn_out = self.self_attn(y, batch, cache, step)
        token_ids, route_rows = batch.token_ids, batch.route_rows
        if keep is None:  # the expand and the ffn's coefficients in one launch on the GPU
            streams, f_pre, post, comb = self.ffn_hc.coefficients_after_expand(attn_out, streams, post, comb,
                                                                               batch.tickets)
        else:
            streams = self.attn_hc.expand(attn_out, streams, post, comb)
            rows, route_rows = keep
            streams, token_ids, a_pre = (t.index_select(0, rows) for t in (streams, token_ids, a_pre))
            f_pre, post, comb = self.ffn_hc.coefficients(streams, batch.tickets)
        y = self.ffn_hc.collapse(streams, a_pre if self.lagged_hc else f_pre, self.post_attention_layernorm)
        out = self.mlp(y, token_ids, route_rows)
        return PendingExpand(out, streams, post, comb), f_pre

    def expand_pending(self, pending: PendingExpand) -> torch.Tensor:
        """The streams a block's `forward_deferred` left unexpanded (its ffn's expand)."""
        return self.ffn_hc.expand(*pending)


class DeepseekV4Model(nn.Module):
    def __init__(self, config: ModelConfig, plan: ModelPlan):
        super().__init__()
        self.hc_mult = config.hc_mult
        # The loader builds on "meta" and fills every weight itself: Embedding's own normal_ init
        # would run there through torch's Python decomposition, whose first call imports
        # torch._dynamo (~3 s of CPU in every process that builds a model). An empty weight skips it.
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, p) for p in plan)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hc_head = HyperHead(config) if plan.hc_head else None


class DeepseekV4ForCausalLM(UsesKernels, nn.Module):
    """The modules follow `plan` (default: `layer_plans(config)`); only its structure matters here
    (ratios, compressor kinds, indexer modes, mHC wiring, Engram tables, the head): row formats
    come with the cache's views."""

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
        self.ngrams: NgramHasher | None = None  # Engram's hashing, set by `set_token_map`
        self.draft_head: nn.Module | None = None  # the MTP drafts' own head (`add_fp8_draft_head`), else lm_head

    @property
    def engram_tables(self) -> int:
        return sum(p.engram_table is not None for p in self.plan)

    def set_token_map(self, token_map: torch.Tensor) -> None:
        """The tokenizer's Engram token map (`engram_hash.compressed_token_map`): the hashing of the
        model's Engram tables (a model with Engram layers needs it before it runs)."""
        self.ngrams = NgramHasher(EngramHashTables.build(self.config, token_map), token_map, self.lm_head.weight.device)

    def bind_kernels(self, impl: str) -> "DeepseekV4ForCausalLM":
        """Every module's ops run `impl` ("auto", "torch" or "triton"; `model/kernels.py`)."""
        return bind_kernels(self, impl)

    def fuse_projections(self) -> None:
        """Once the weights are in place: every layer runs the projections that share an input as
        one GEMM (`model/fusion.py`; members that round their input first stay apart)."""
        for layer in [*self.model.layers, *getattr(self, "mtp", ())]:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()
        if self.plan.fp32_head:  # V4.1's head runs in fp32: keep its weight in fp32 only (no bf16 copy beside it)
            self.lm_head.weight = nn.Parameter(self.lm_head.weight.detach().float(), requires_grad=False)

    def add_fp8_draft_head(self) -> None:
        """Give the MTP drafts an FP8 block-scaled copy of the lm head (speculative_config
        draft_head="fp8"): e4m3 codes with ue8m0 scales per FP8_DRAFT_HEAD_BLOCK, quantized from the
        loaded head (`FP8Linear.quantized_from`), weight-only numerics. Verification keeps the lm head."""
        from v4serve.model.quantized import FP8Linear

        self.draft_head = FP8Linear.quantized_from(self.lm_head.weight.detach(), FP8_DRAFT_HEAD_BLOCK)
        self.draft_head.impl = self.impl

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
        pre = None
        if self.model.layers[0].lagged_hc:  # the first block's attention collapses stream 0
            pre = torch.zeros(x.shape[0], self.model.hc_mult, dtype=torch.float32, device=x.device)
            pre[:, 0] = 1.0
        rows = ()
        if self.engram_tables:
            if self.ngrams is None:
                raise RuntimeError("a DeepSeek-V4.1 model with Engram layers needs `set_token_map` before it runs")
            rows = self.ngrams.rows(batch, cache.token_history)
        step = plan_step(batch, self.rope(), rows)
        for i, layer in enumerate(self.model.layers):  # each block's last expand runs in the next one's first mixer
            streams, pre = layer.forward_deferred(streams, pre, batch, cache.view(i), step)
        streams = self.model.layers[-1].expand_pending(streams)
        keep = slice(None) if batch.is_decode else batch.logits_indices  # decode: every token's logits
        return self._head(streams[keep], pre[keep], batch), streams

    def _head(self, streams: torch.Tensor, last_pre: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        """fp32 logits of the final streams; `last_pre`: the last block's ffn pre."""
        norm = self.model.norm  # the final RMSNorm runs in the collapse's launch on the GPU
        if self.model.hc_head is not None:
            h = self.model.hc_head(streams, batch.tickets, norm)
        else:  # V4.1: the last block's ffn pre collapses the streams
            h = hc_collapse(streams, last_pre, norm.weight, norm.eps, impl=self.impl)
        return self._logits(h)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        """fp32 logits of normed hidden rows h; V4.1 (plan.fp32_head) computes them in fp32, from the
        weight fuse_projections widened once (through the module, so hooks such as the tensor-parallel
        all-gather still run)."""
        if not self.plan.fp32_head:
            return self.lm_head(h).float()
        if self.lm_head.weight.dtype == torch.float32:
            return self.lm_head(h.float())
        return F.linear(h.float(), self.lm_head.weight.float())  # before fuse_projections

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
        h = layer.head_input(picked, batch)
        return (self._logits(h) if self.draft_head is None else self.draft_head(h).float()), streams
