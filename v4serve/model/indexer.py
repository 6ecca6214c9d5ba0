"""Lightning indexer of CSA layers: picks, per query, the compressed rows it attends to.

It owns a compressor of its own (overlap, head dim `index_head_dim`) whose rows are the index
keys, a query projection from the attention's low-rank q, and per-head weights:

    q_i[p, h] = rope(wq_b qr_p)[h]                         (compressed-layer RoPE table, position p)
    w[p, h]   = (x_p Ww^T)[h] * index_head_dim^-0.5 * index_n_heads^-0.5
    score[p, t] = sum_h w[p, h] * relu(q_i[p, h] . k_t)     over t < (p + 1) // ratio
    selected(p) = top-min(index_topk, rows) of score[p, :]   (-1 where fewer rows are visible)
"""

from __future__ import annotations

import torch
from torch import nn

from v4serve.cache import ForwardBatch, LayerCache
from v4serve.config import ModelConfig
from v4serve.model.compressor import Compressor
from v4serve.model.rope import StepRope
from v4serve.ops.indexer import index_scores, select_topk, sorted_top
from v4serve.ops.hadamard import hadamard
from v4serve.ops.norm_rope import rms_norm_rope
from v4serve.ops.pick_columns import pick_columns


class IndexScorer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.weights_proj = nn.Linear(config.hidden_size, config.index_n_heads, bias=False, dtype=torch.float32)


class Indexer(Compressor):
    def __init__(self, config: ModelConfig, ratio: int):
        super().__init__(config, config.index_head_dim, ratio, overlap=True)
        self.n_heads = config.index_n_heads
        self.topk = config.index_topk
        self.weight_scale = config.index_head_dim**-0.5 * config.index_n_heads**-0.5
        self.q_b_proj = nn.Linear(config.q_lora_rank, config.index_n_heads * config.index_head_dim, bias=False)
        self.scorer = IndexScorer(config)

    def projections(self) -> list[nn.Linear]:
        """The fp32 projections of the layer input: the key compressor's kv and gate, the head weights."""
        return [*super().projections(), self.scorer.weights_proj]

    def select(
        self, projected: list[torch.Tensor], qr: torch.Tensor, batch: ForwardBatch, cache: LayerCache, rope: StepRope,
    ) -> torch.Tensor:
        """Index the step's new blocks, then return each token's attention columns [T, W + K]: its
        window columns (`batch.window_columns`), then K compressed-pool rows, best first (-1 = none;
        a decode step leaves the entries past `batch.live_picks` unmarked instead).
        projected: the layer input through `projections()` (fp32); qr: the attention's low-rank q.
        Queries and keys are Hadamard-rotated (the rotation cancels in q . k; it spreads outliers
        before the fp4 rounding) and rounded to the keys' format when the cache quantizes them."""
        kv_all, score_all, head_weights = projected
        keys, rotate = cache.index_keys, cache.plan.index_rotated
        self.compress(kv_all, score_all, batch, cache.indexer_state, keys, rope, rotate)
        q = self.q_b_proj(qr).unflatten(-1, (self.n_heads, self.head_dim))
        angles = dict(cos=rope.compress.cos, sin=rope.compress.sin, impl=self.impl)
        if rotate and q.dtype == keys.value_dtype:  # RoPE and Hadamard in one kernel
            q = rms_norm_rope(q, **angles, hadamard=True)
        else:
            q = rms_norm_rope(q, **angles).to(keys.value_dtype)
            q = hadamard(q, self.impl) if rotate else q
        q = keys.round(q, self.impl)
        pool = keys.data
        packed = {"row_format": keys.read_format}
        scaled = dict(weight_scale=self.weight_scale, impl=self.impl, **packed)  # the scale inside the kernel
        rows_of = batch.compressed_rows[self.ratio]
        k = min(self.topk, rows_of.shape[1])
        if batch.is_decode:  # one query per sequence: one call over every sequence's rows
            visible = batch.visible_compressed(self.ratio)
            scores = index_scores(q[:, None], head_weights[:, None], pool, rows_of, visible[:, None], **scaled)
            # Masked keys score -inf and sort last, past the `live_picks` count where the attention
            # stops reading: they need no -1 (every visible row is allocated and scores finitely).
            # The top-k reads each row's visible prefix only (not the cache width).
            _, order = sorted_top(scores[:, 0], k, self.impl, n_live=visible)  # [B, k] columns of rows_of
            return pick_columns(batch.window_columns, rows_of, order, k, impl=self.impl)  # one launch
        selected = torch.full((batch.num_tokens, k), -1, dtype=torch.int32, device=qr.device)
        for b, c in enumerate(batch.chunks):
            n_rows = c.end // self.ratio
            if n_rows == 0 or k == 0:
                continue
            span = slice(c.offset, c.offset + c.length)
            key_rows = rows_of[b:b + 1, :n_rows]
            visible = ((batch.positions[span] + 1) // self.ratio).to(torch.int32)[None]
            scores = index_scores(q[None, span], head_weights[None, span], pool, key_rows, visible, **scaled)
            picks = select_topk(scores, k, self.impl)[0]  # [L, k] compressed row ids, -1 = none
            rows = key_rows[0, picks.clamp(min=0)]
            selected[span] = torch.where(picks >= 0, rows, -1)
        return torch.cat((batch.window_columns, selected), dim=1)
