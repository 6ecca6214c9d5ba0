"""KV compressor: pools every `ratio` tokens of a layer's input into one compressed row.

For token t: kv_t = x_t Wkv^T, s_t = x_t Wgate^T + ape[t mod ratio] (fp32). Compressed row g is a
per-channel softmax-gated pool:

* without overlap (HCA): over the `ratio` tokens of block g;
* with overlap (CSA, and every indexer): over 2*ratio candidates, the first head_dim channels
  of block g-1's tokens and the last head_dim channels of block g's tokens (block -1: score -inf);

then `kv_norm` (RMSNorm), then RoPE on the last rope channels at the block's START position
g*ratio with the compressed-layer table. Row g exists once token g*ratio + ratio - 1 is seen.

State between steps (`cache.kv_cache.CompressorState`): the open block's projected rows, and for
overlap the previous complete block's, so chunked prefill and decode pool exactly what one
full-sequence pass would.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from v4serve.cache import ForwardBatch
from v4serve.cache.kv_cache import CompressorState
from v4serve.config import ModelConfig
from v4serve.model.norm import RMSNorm
from v4serve.model.rope import apply_rope
from v4serve.ops.gated_pool import gated_pool
from v4serve.ops.kv_quant import apply_kv_format


class Compressor(nn.Module):
    def __init__(
        self, config: ModelConfig, head_dim: int, ratio: int, overlap: bool, indexer: nn.Module | None = None
    ):
        super().__init__()
        self.head_dim = head_dim
        self.ratio = ratio
        self.overlap = overlap
        width = (2 if overlap else 1) * head_dim
        # The reference runs the compressor projections in fp32; they are kept fp32 at any model dtype.
        self.kv_proj = nn.Linear(config.hidden_size, width, bias=False, dtype=torch.float32)
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False, dtype=torch.float32)
        self.position_bias = nn.Parameter(torch.zeros(ratio, width, dtype=torch.float32))
        self.kv_norm = RMSNorm(head_dim, config.rms_norm_eps)
        # A CSA layer's indexer sits under its compressor, as in the checkpoints (`compressor.indexer.*`).
        self.indexer = indexer

    def compress(
        self, x: torch.Tensor, batch: ForwardBatch, state: CompressorState, pool: torch.Tensor, inv_freq: torch.Tensor,
        row_format: str | None,
    ) -> None:
        """Pool every block the step completes and write its row to `pool` (rows from `batch`),
        rounded through `row_format` (the indexer passes None and rounds its keys itself)."""
        kv_all = F.linear(x.float(), self.kv_proj.weight)
        score_all = F.linear(x.float(), self.gate_proj.weight)
        if batch.is_decode:
            self._compress_decode(kv_all, score_all, batch, state, pool, inv_freq, row_format)
            return
        rows_of = batch.compressed_rows[self.ratio]
        for b, c in enumerate(batch.chunks):
            span = slice(c.offset, c.offset + c.length)
            in_block = (batch.positions[span] % self.ratio).long()
            rows, first_group = self._pool_chunk(
                kv_all[span], score_all[span] + self.position_bias[in_block], state, c.slot, c.start, batch.kernels
            )
            if rows is None:
                continue
            groups = torch.arange(first_group, first_group + rows.shape[0], device=rows.device)
            rows = apply_rope(self.kv_norm(rows.to(pool.dtype)), groups * self.ratio, inv_freq)
            pool[rows_of[b, groups].long()] = self.finish_rows(rows, row_format, batch.kernels)

    def _compress_decode(
        self, kv: torch.Tensor, score: torch.Tensor, batch: ForwardBatch, state: CompressorState,
        pool: torch.Tensor, inv_freq: torch.Tensor, row_format: str | None,
    ) -> None:
        """One token per sequence, no host decisions: every sequence records its token in the open
        block and pools it; sequences whose block did not complete write to the pool's scratch row."""
        r, d = self.ratio, self.head_dim
        p, slots = batch.positions, batch.slots
        base = state.kv.shape[1] - r
        state.kv[slots, base + p % r] = kv
        state.score[slots, base + p % r] = score + self.position_bias[p % r]
        open_kv, open_score = state.kv[slots, base:], state.score[slots, base:]  # [B, r, width]
        complete = (p + 1) % r == 0
        if self.overlap:
            prev_kv, prev_score = state.kv[slots, :r], state.score[slots, :r]
            pool_kv = torch.cat((prev_kv[..., :d], open_kv[..., d:]), dim=1)
            pool_score = torch.cat((prev_score[..., :d], open_score[..., d:]), dim=1)
            keep = complete[:, None, None]
            state.kv[slots, :r] = torch.where(keep, open_kv, prev_kv)  # the block becomes "previous"
            state.score[slots, :r] = torch.where(keep, open_score, prev_score)
        else:
            pool_kv, pool_score = open_kv, open_score
        rows = gated_pool(pool_kv, pool_score, out_dtype=torch.float32, impl=batch.kernels)
        rows = apply_rope(self.kv_norm(rows.to(pool.dtype)), p + 1 - r, inv_freq)
        group = ((p + 1) // r - 1).clamp(min=0)
        target = batch.compressed_rows[r].gather(1, group[:, None])[:, 0].long()
        scratch = pool.shape[0] - 1
        pool[torch.where(complete & (target >= 0), target, scratch)] = self.finish_rows(rows, row_format, batch.kernels)

    def finish_rows(self, rows: torch.Tensor, row_format: str | None, kernels: str) -> torch.Tensor:
        """Round rows to what the cache stores."""
        return rows if row_format is None else apply_kv_format(rows, row_format, impl=kernels)

    def _pool_chunk(
        self, kv: torch.Tensor, score: torch.Tensor, state: CompressorState, slot: int, start: int, kernels: str
    ) -> tuple[torch.Tensor | None, int]:
        """(pooled rows [n, head_dim] fp32 of the blocks completed in this chunk, first group id)."""
        r, d = self.ratio, self.head_dim
        open_rows = start % r
        base = state.kv.shape[1] - r  # where the open block's rows start in the state
        kv = torch.cat((state.kv[slot, base:base + open_rows], kv))  # positions [start - open_rows, end)
        score = torch.cat((state.score[slot, base:base + open_rows], score))
        n_blocks = kv.shape[0] // r
        done = n_blocks * r
        width = kv.shape[-1]
        blocks_kv, blocks_score = kv[:done].view(n_blocks, r, width), score[:done].view(n_blocks, r, width)
        pooled = None
        if n_blocks:
            if self.overlap:
                prev_kv = torch.cat((state.kv[slot, None, :r], blocks_kv[:-1]))[..., :d]
                prev_score = torch.cat((state.score[slot, None, :r], blocks_score[:-1]))[..., :d]
                pool_kv = torch.cat((prev_kv, blocks_kv[..., d:]), dim=1)  # [n, 2r, d]
                pool_score = torch.cat((prev_score, blocks_score[..., d:]), dim=1)
                state.kv[slot, :r], state.score[slot, :r] = blocks_kv[-1], blocks_score[-1]
            else:
                pool_kv, pool_score = blocks_kv, blocks_score
            pooled = gated_pool(pool_kv, pool_score, out_dtype=torch.float32, impl=kernels)
        rest = kv.shape[0] - done
        state.kv[slot, base:base + rest] = kv[done:]
        state.score[slot, base:base + rest] = score[done:]
        return pooled, (start - open_rows) // r
