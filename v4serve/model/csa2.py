"""DeepSeek-V4.1 compressed attention ("CSA2"): the kv-source compressor and the indexer, and the
columns a compressed layer attends to. Built on V4's Compressor (pooling, state) and attention.

Roles (`ModelConfig.v41.role`): full (kv source: compressor + index keys + own indexer), reindex
(own indexer over the source's keys), reuse (the top-k published last), window (ratio 0).

Source compressor, per complete block g of `ratio` tokens (row start s = g * ratio):
    ratio 2: latent = kv_norm(bf16(gated_pool(x Wkv^T, x Wgate^T)))   (fp32 projections, no ape)
    ratio 1: latent = kv_norm(x Wkv^T)                                  (bf16, gateless, no state)
    index key  = fp4_e8m0_b32(rope(k_norm(latent Wk^T), s))             -> the source's index pool
    main row   = fp4_e4m3_b16(rope(latent, s))                          -> the source's compressed pool
(no Hadamard; the layer plan names the row formats, the view's pools round or pack to them).

Indexer (full and reindex layers), query at position p seeing n = (p + 1) // ratio source rows:
    q = fp4_e8m0_b32(rope(Wq_b qr, p));  w = bf16(x Ww^T * index_head_dim^-0.5 * index_n_heads^-0.5)
    scores / candidates / top-k: `ops/v41_index.py`; the candidate source publishes its candidate
    mask, reindex layers after it score only those rows; every index layer publishes its top-k.
    With Triton (CUDA) the scores come from the kernels over the pool's packed rows, the candidate
    source publishes its kept blocks as a list and reindex layers score only their slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from v4serve.cache import ForwardBatch, LayerCache
from v4serve.config import ModelConfig
from v4serve.layer_plan import IndexerMode, LayerPlan
from v4serve.model.compressor import Compressor
from v4serve.model.kernels import UsesKernels
from v4serve.model.norm import RMSNorm
from v4serve.model.rope import StepRope, rotary_angles
from v4serve.ops.compress_decode import compress_decode
from v4serve.ops.norm_rope import rms_norm_rope
from v4serve.ops._dispatch import use_triton
from v4serve.ops.v41_index import (
    candidate_blocks,
    candidate_mask,
    index_scores_v41,
    select_candidates,
    select_sorted,
    v41_index_scores,
)


class IndexerV41(UsesKernels, nn.Module):
    """Index queries and head weights of a full / reindex layer; a kv source also owns the key
    projection (`wk`, `k_norm`) applied to its compressor's latent."""

    def __init__(self, config: ModelConfig, plan: LayerPlan):
        super().__init__()
        v = config.v41
        self.layer = plan.layer
        self.ratio = plan.ratio
        self.n_heads, self.head_dim = config.index_n_heads, config.index_head_dim
        self.topk = config.index_topk
        self.weight_scale = config.index_head_dim**-0.5 * config.index_n_heads**-0.5
        self.is_candidate_source = plan.publishes_candidates
        self.restricted = plan.candidate_restricted
        self.block, self.n_blocks = v.candidate_block_size, v.candidate_topk_blocks
        self.q_b_proj = nn.Linear(config.q_lora_rank, self.n_heads * self.head_dim, bias=False)
        self.weights_proj = nn.Linear(config.hidden_size, self.n_heads, bias=False)
        if plan.indexer is IndexerMode.FULL:
            self.wk = nn.Linear(config.head_dim, self.head_dim, bias=False)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def keys(self, latent: torch.Tensor, starts: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        """Index keys of latents [N, head_dim] rotated at their block starts [N] (the pool rounds them)."""
        angles = rotary_angles(starts, inv_freq)
        return rms_norm_rope(self.wk(latent), self.k_norm.eps, self.k_norm.weight, angles.cos, angles.sin,
                             impl=self.impl)

    def select(self, x: torch.Tensor, qr: torch.Tensor, batch: ForwardBatch, cache: LayerCache,
               rope: StepRope) -> torch.Tensor:
        """[T, topk] int32 compressed rows (sequence-local ids) each token attends to, -1 = none;
        publishes them (and, at the candidate source, the candidate mask) on `batch.published`."""
        t_all, keys = x.shape[0], cache.index_keys
        q = self.q_b_proj(qr).unflatten(-1, (self.n_heads, self.head_dim))
        q = keys.round(rms_norm_rope(q, cos=rope.compress.cos, sin=rope.compress.sin, impl=self.impl), self.impl)
        w = (self.weights_proj(x).float() * self.weight_scale).to(torch.bfloat16)
        if use_triton(self.impl, x):
            return self._select_on_device(q, w, batch, keys)
        rows_of = batch.compressed_rows[self.ratio]  # [B, R]
        visible = batch.visible_compressed(self.ratio)
        width = rows_of.shape[1]
        picks = torch.full((t_all, self.topk), -1, dtype=torch.int32, device=x.device)
        candidates = torch.zeros(t_all, width, dtype=torch.bool, device=x.device) if self.is_candidate_source else None
        allowed = batch.published.get("candidates") if self.restricted else None
        for span, b in _token_groups(batch):
            allow = None if allowed is None else allowed[span]
            rows = rows_of[b]  # [R] (a prefill chunk) or [B, R] (a decode step: each token its sequence's)
            k = keys.values(rows.clamp(min=0).long().flatten()).view(*rows.shape, -1)  # decoded when packed
            scores = index_scores_v41(q[span], w[span], k, rows >= 0, visible[span], allow)
            if candidates is not None:
                candidates[span] = candidate_mask(scores, visible[span], self.block, self.n_blocks)
            picks[span] = select_sorted(scores, self.topk, visible[span])
        batch.published["topk"] = picks
        if candidates is not None:
            batch.published["candidates"] = candidates
        return picks


    def _select_on_device(self, q: torch.Tensor, w: torch.Tensor, batch: ForwardBatch, keys) -> torch.Tensor:
        """`select` through the Triton kernels (ops/v41_index.py), no host sync: scores over the pool's
        rows as stored (packed fp4 words or bf16), in full mode, or in candidate mode over the blocks
        the candidate source published ("candidate_blocks": [T, blocks] int32, ascending, -1 after)."""
        rows_of = batch.compressed_rows[self.ratio]  # [B, R]
        visible = batch.visible_compressed(self.ratio)
        picks = torch.full((q.shape[0], self.topk), -1, dtype=torch.int32, device=q.device)
        published = batch.published.get("candidate_blocks") if self.restricted else None
        kept = min(self.n_blocks, -(-rows_of.shape[1] // self.block))
        blocks = None
        if self.is_candidate_source:
            blocks = torch.full((q.shape[0], kept), -1, dtype=torch.int32, device=q.device)
        fmt = keys.read_format
        for span, b in _token_groups(batch):
            if batch.is_decode:  # B sequences, one query each
                qs, ws, rows, seen = q[:, None], w[:, None], rows_of, visible[:, None]
                cands = None if published is None else published[:, None]
            else:  # one sequence's chunk
                qs, ws, rows, seen = q[span][None], w[span][None], rows_of[b][None], visible[span][None]
                cands = None if published is None else published[span][None]
            scores = v41_index_scores(qs, ws, keys.data, rows, seen, row_format=fmt, cand_blocks=cands,
                                      cand_block=self.block, impl=self.impl).flatten(0, 1)
            seen = seen.flatten()
            if cands is not None:
                picks[span] = select_candidates(scores, cands.flatten(0, 1), self.block, self.topk, seen)
                continue
            if blocks is not None:
                blocks[span] = candidate_blocks(scores, seen, self.block, self.n_blocks)
            picks[span] = select_sorted(scores, self.topk, seen)
        batch.published["topk"] = picks
        if blocks is not None:
            batch.published["candidate_blocks"] = blocks
        return picks


def _token_groups(batch: ForwardBatch):
    """(token span, sequence index) runs sharing one sequence's rows: prefill chunks; a decode step
    is one run with every sequence's rows ([B, R])."""
    if batch.is_decode:
        return [(slice(None), slice(None))]
    return [(slice(c.offset, c.offset + c.length), b) for b, c in enumerate(batch.chunks)]


class SourceCompressor(Compressor):
    """A V4.1 kv source's compressor: V4's pooling (ratio 2, online state, no position bias) or a
    gateless ratio-1 projection, writing compressed rows and index keys of the latent."""

    def __init__(self, config: ModelConfig, ratio: int):
        super().__init__(config, config.head_dim, ratio, overlap=False)
        del self.position_bias  # V4.1 has no ape: a constant zero bias, not a checkpoint tensor
        self.register_buffer("position_bias", torch.zeros(ratio, config.head_dim), persistent=False)
        if ratio == 1:  # gateless, in the model dtype
            self.kv_proj = nn.Linear(config.hidden_size, config.head_dim, bias=False)
            self.gate_proj = None

    def projections(self) -> list[nn.Linear]:
        return [self.kv_proj] + ([self.gate_proj] if self.gate_proj is not None else [])

    def write(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache, rope: StepRope,
              indexer: IndexerV41) -> None:
        """Pool the blocks the step completes; write their compressed rows and index keys."""
        pool, keys = cache.compressed, cache.index_keys
        if self.gate_proj is None:
            kv = self.kv_proj(x).float()
            score = torch.zeros_like(kv)
        else:
            xf = x.float()
            kv, score = F.linear(xf, self.kv_proj.weight.float()), F.linear(xf, self.gate_proj.weight.float())
        inv_freq = rope.compress.inv_freq
        state = cache.compressor_state
        if batch.is_decode:
            latent, target = self._latent_decode(kv, score, batch, state, pool)
            starts = batch.positions + 1 - self.ratio
            self._emit(latent, starts.clamp(min=0), target, pool, keys, inv_freq, indexer)
            return
        rows_of = batch.compressed_rows[self.ratio]
        for b, c in enumerate(batch.chunks):
            span = slice(c.offset, c.offset + c.length)
            if self.ratio == 1:
                rows, first = kv[span], c.start
            else:
                rows, first = self._pool_chunk(kv[span], score[span], state, c.slot, c.start)
            if rows is None:
                continue
            groups = torch.arange(first, first + rows.shape[0], device=rows.device)
            latent = rms_norm_rope(rows.to(pool.value_dtype), self.kv_norm.eps, self.kv_norm.weight, impl=self.impl)
            self._emit(latent, groups * self.ratio, rows_of[b, groups].long(), pool, keys, inv_freq, indexer)

    def _latent_decode(self, kv, score, batch, state, pool):
        """One token per sequence through the shared decode op with a zero rotation: the normalised,
        unrotated latent of each completed block and its pool row (scratch where none completes)."""
        zeros = torch.zeros(kv.shape[0], 1, device=kv.device)
        return compress_decode(
            kv, score, batch.positions, batch.slots, self.position_bias, state.tensors(), self.ratio,
            self.kv_norm.weight, self.kv_norm.eps, zeros + 1, zeros, batch.compressed_rows[self.ratio],
            pool.scratch_row, pool.value_dtype, impl=self.impl,
        )

    def _emit(self, latent, starts, target, pool, keys, inv_freq, indexer):
        keys.store(target, indexer.keys(latent, starts, inv_freq), self.impl)
        angles = rotary_angles(starts, inv_freq)
        pool.store(target, rms_norm_rope(latent, cos=angles.cos, sin=angles.sin, impl=self.impl), self.impl)


def compressed_columns(attn: nn.Module, x: torch.Tensor, qr: torch.Tensor, batch: ForwardBatch,
                       cache: LayerCache, rope: StepRope) -> torch.Tensor:
    """[T, W + topk] int32 columns of a V4.1 compressed layer: its window columns, then the pool rows
    of its selection (its own indexer's, or the one published last), -1 = none."""
    if attn.compressor is not None:
        attn.compressor.write(x, batch, cache, rope, attn.indexer)
    picks = attn.indexer.select(x, qr, batch, cache, rope) if attn.indexer is not None else batch.published["topk"]
    rows_of = batch.compressed_rows[attn.ratio]
    per_token = rows_of if batch.is_decode else rows_of[batch.token_chunk]
    rows = per_token.gather(1, picks.clamp(min=0).long())
    return torch.cat((batch.window_columns, torch.where(picks >= 0, rows, -1).to(torch.int32)), dim=1)
