"""The DeepSeek-V4.1 causal LM on V4's blocks (`deepseek_v4.DecoderLayer`):

    X = embed(ids) in all hc_mult streams;  pre = one-hot(stream 0)
    per layer L:  X = engram_L(X) (Engram layers);  X, pre = layer_L.forward_lagged(X, pre)
    logits = head(norm(sum_j pre_j X_j))           (no hc_head; head in fp32)

Layer roles, window formats and the compressed-row sharing come from `config.v41` and the cache
(`cache/geometry.py`); Engram reads each sequence's last max_ngram - 1 token ids from the cache
(`PagedKVCache.token_history`, reset to the pad id when a sequence opens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from v4serve.cache import ForwardBatch, PagedKVCache
from v4serve.config import ModelConfig
from v4serve.model.deepseek_v4 import DecoderLayer
from v4serve.model.engram import Engram
from v4serve.layer_plan import ModelPlan, layer_plans
from v4serve.model.engram_hash import EngramHashTables
from v4serve.model.kernels import UsesKernels, bind_kernels
from v4serve.model.norm import RMSNorm
from v4serve.model.rope import RopeTables
from v4serve.model.step_plan import plan_step
from v4serve.ops.hc_collapse import hc_collapse


class DeepseekV41Model(nn.Module):
    def __init__(self, config: ModelConfig, plan: ModelPlan):
        super().__init__()
        self.hc_mult = config.hc_mult
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, p) for p in plan)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        v = config.v41
        self.engram = nn.ModuleDict({
            str(layer): Engram(config, n) for layer, n in zip(v.engram_layer_ids, v.engram_num_embeddings)
        })


class DeepseekV41ForCausalLM(UsesKernels, nn.Module):
    """The modules follow `plan` (default: `layer_plans(config)`: the roles of `config.v41`)."""

    def __init__(self, config: ModelConfig, plan: ModelPlan | None = None):
        super().__init__()
        self.config = config
        self.plan = plan if plan is not None else layer_plans(config)
        self.model = DeepseekV41Model(config, self.plan)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._rope: RopeTables | None = None
        v = config.v41
        self.history_len = v.engram_max_ngram_size - 1 if v.engram_layer_ids else 0
        self.hash_tables: EngramHashTables | None = None  # set by `set_token_map`
        self.token_map: torch.Tensor | None = None

    def set_token_map(self, token_map: torch.Tensor) -> None:
        """The tokenizer's Engram token map (`engram_hash.compressed_token_map`) and the hash tables."""
        self.hash_tables = EngramHashTables.build(self.config, token_map)
        self.token_map = token_map.to(self.lm_head.weight.device)

    def bind_kernels(self, impl: str) -> "DeepseekV41ForCausalLM":
        return bind_kernels(self, impl)

    def fuse_projections(self) -> None:
        """Nothing to fuse: each V4.1 GEMM rounds its own input (`v41_quant.quantize_linear_inputs`)."""

    def rope(self) -> RopeTables:
        device = self.lm_head.weight.device
        if self._rope is None or self._rope.main.device != device:
            self._rope = RopeTables(self.config, self.plan.ratios, device)
        return self._rope

    def engram_rows(self, batch: ForwardBatch, cache: PagedKVCache) -> list[torch.Tensor]:
        """Per Engram layer, the table rows [T, R] of the step's tokens; advances the cache's token history."""
        n = self.history_len
        hist = cache.token_history
        if batch.is_decode:
            ctx = torch.cat((hist[batch.slots], batch.token_ids[:, None]), dim=1)  # [B, n + 1], oldest first
            windows = ctx.flip(1)
            hist[batch.slots] = ctx[:, 1:]
        else:
            parts = []
            for c in batch.chunks:
                ctx = torch.cat((hist[c.slot], batch.token_ids[c.offset:c.offset + c.length]))
                parts.append(torch.stack([ctx[n - k:n - k + c.length] for k in range(n + 1)], dim=1))
                hist[c.slot] = ctx[-n:]
            windows = torch.cat(parts)
        cids = self.token_map[windows]
        return [self.hash_tables.hash(cids, i) for i in range(len(self.hash_tables.layer_ids))]

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, cache: PagedKVCache) -> torch.Tensor:
        """Run one step; return fp32 logits [len(batch.logits_indices), vocab]."""
        x = self.model.embed_tokens(batch.token_ids)
        streams = x.unsqueeze(1).expand(-1, self.model.hc_mult, -1).contiguous()
        pre = torch.zeros(x.shape[0], self.model.hc_mult, dtype=torch.float32, device=x.device)
        pre[:, 0] = 1.0
        step = plan_step(batch, self.rope())
        if self.config.v41.engram_layer_ids and self.hash_tables is None:
            raise RuntimeError("a DeepSeek-V4.1 model with Engram layers needs `set_token_map` before it runs")
        rows = self.engram_rows(batch, cache) if self.hash_tables is not None else []
        engram_index = {layer: i for i, layer in enumerate(self.hash_tables.layer_ids)} if rows else {}
        for i, layer in enumerate(self.model.layers):
            if i in engram_index:
                streams = self.model.engram[str(i)](streams, rows[engram_index[i]])
            streams, pre = layer.forward_lagged(streams, pre, batch, cache.view(i), step)
        if not batch.is_decode:
            streams, pre = streams[batch.logits_indices], pre[batch.logits_indices]
        h = self.model.norm(hc_collapse(streams, pre, impl=self.impl))
        return F.linear(h.float(), self.lm_head.weight.float())
