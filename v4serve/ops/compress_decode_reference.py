"""One decode step of a KV compressor (one new token per sequence): the torch reference.

For sequence b at position p (slot s, ratio r, in-block index j = p mod r), with the token's
projected kv and score rows (fp32, width W) and score += position_bias[j]:

* overlap (CSA, indexer; W = 2d): the token is stored as row r + j of the state
  `[slots, 2r, W]`; when it completes its block (j = r - 1) the row is the per-channel softmax
  pool over 2r candidates, channels [0, d) of the previous block (rows [0, r)) and channels
  [d, 2d) of this block (rows [r, 2r)), and this block becomes the previous one.
* online (HCA; W = d): the token is folded into the state's running max, sum and weighted sum
  `[slots, d]` each; a complete block's row is sum(w kv) / sum(w) and the state starts over.

A complete block's row is then RMS-normalised with `norm_weight` (rounded to `out_dtype`) and
rotated by cos, sin [B, R] (the angles of its block start p + 1 - r). The step returns the rows
[B, d] (zero where no block completes) and each row's target in the compressed pool: row
`rows_of[b, (p + 1) // r - 1]` when the block completes and that row exists, else `scratch`.
"""

from __future__ import annotations

import torch

from v4serve.ops.gated_pool_reference import gated_pool_reference
from v4serve.ops.norm_rope_reference import rms_norm_rope_reference


def fold_online(
    running_max: torch.Tensor, total: torch.Tensor, acc: torch.Tensor, kv: torch.Tensor, score: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold rows kv, score [..., n, w] into an online softmax pool (running max, sum of exp(score -
    max), sum of exp(score - max) * kv; each [..., w]); the pooled row is acc / total."""
    new_max = torch.maximum(running_max, score.amax(dim=-2))
    rescale = torch.exp(running_max - new_max)
    weight = torch.exp(score - new_max.unsqueeze(-2))
    return new_max, total * rescale + weight.sum(dim=-2), acc * rescale + (weight * kv).sum(dim=-2)


def _fold_overlap(kv, score, p, slots, state, r):
    """Record the token in the open block; pool the 2r candidates; shift completed blocks."""
    state_kv, state_score = state
    d = state_kv.shape[-1] // 2
    complete = (p + 1) % r == 0
    state_kv[slots, r + p % r] = kv
    state_score[slots, r + p % r] = score
    open_kv, open_score = state_kv[slots, r:], state_score[slots, r:]  # [B, r, 2d]
    prev_kv, prev_score = state_kv[slots, :r], state_score[slots, :r]
    pool_kv = torch.cat((prev_kv[..., :d], open_kv[..., d:]), dim=1)
    pool_score = torch.cat((prev_score[..., :d], open_score[..., d:]), dim=1)
    keep = complete[:, None, None]
    state_kv[slots, :r] = torch.where(keep, open_kv, prev_kv)  # the block becomes "previous"
    state_score[slots, :r] = torch.where(keep, open_score, prev_score)
    return gated_pool_reference(pool_kv, pool_score, torch.float32)


def _fold_online(kv, score, p, slots, state, r):
    """Fold the token into the open block's online softmax; a complete block starts over."""
    state_max, state_sum, state_acc = state
    m, total, acc = fold_online(state_max[slots], state_sum[slots], state_acc[slots], kv[:, None], score[:, None])
    done = ((p + 1) % r == 0)[:, None]
    state_max[slots] = torch.where(done, float("-inf"), m)
    state_sum[slots] = torch.where(done, 0.0, total)
    state_acc[slots] = torch.where(done, 0.0, acc)
    return acc / total


def compress_decode_reference(
    kv: torch.Tensor, score: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
    position_bias: torch.Tensor, state: tuple[torch.Tensor, ...], ratio: int, norm_weight: torch.Tensor,
    eps: float, cos: torch.Tensor, sin: torch.Tensor, rows_of: torch.Tensor, scratch: int, out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    r, p = ratio, positions
    score = score + position_bias[p % r]
    fold = _fold_overlap if len(state) == 2 else _fold_online
    rows = fold(kv, score, p, slots, state, r)
    complete = (p + 1) % r == 0
    rows = rms_norm_rope_reference(rows.to(out_dtype), eps, norm_weight, cos, sin)
    rows = torch.where(complete[:, None], rows, 0)
    group = ((p + 1) // r - 1).clamp(min=0)
    target = rows_of.gather(1, group[:, None])[:, 0].long()
    return rows, torch.where(complete & (target >= 0), target, scratch)
