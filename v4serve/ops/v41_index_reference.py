"""DeepSeek-V4.1 indexer scoring and selection: the torch references (the public entry points, the
Triton kernels over packed fp4 keys and the device-side selection are in v41_index.py).

Scores, as the reference computes them (bf16 at every step; q and keys already fp4-rounded):

    l[s, h, t]  = bf16(q[s, h] . k[key_rows[t]])            (fp32 accumulation, one rounding)
    score[s, t] = bf16(sum_h bf16(relu(l[s, h, t]) * w[s, h]))
    -inf where t >= n_visible[s], key_rows[t] == -1, or (candidate-restricted) not allowed[s, t].

Candidate blocks (the candidate-source layer): block score b[s, j] = max_{t in block j} score[s, t]
(blocks of `block` rows), the block holding the newest visible row (n_visible - 1) // block pinned
to +inf, the top min(n_blocks, #blocks) blocks with a finite score kept; `allowed` = their rows.

Selection: the top min(k, n_visible) scores per query, columns sorted ascending, -1 for picks at
or past n_visible and for the unused tail of the k slots.
"""

from __future__ import annotations

import torch

_NEG = float("-inf")


def index_scores_v41(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, key_valid: torch.Tensor,
                     n_visible: torch.Tensor, allowed: torch.Tensor | None = None) -> torch.Tensor:
    """q [S, H, D] and weights [S, H] (bf16 values); keys [T, D] shared by every query, or [S, T, D]
    (each query its own sequence's keys: a decode step), already gathered (and decoded);
    key_valid [T] / [S, T] bool (False: a hole); n_visible [S] int; allowed [S, T] bool or None
    -> fp32 [S, T] holding bf16 values, -inf where masked."""
    spec = "shd,td->sht" if keys.dim() == 2 else "shd,std->sht"
    logits = torch.einsum(spec, q.float(), keys.float()).to(torch.bfloat16).float().relu_()
    prod = (logits * weights.to(torch.bfloat16).float()[:, :, None]).to(torch.bfloat16).float()
    scores = prod.sum(1).to(torch.bfloat16).float()
    t = torch.arange(keys.shape[-2], device=q.device)
    visible = (t[None, :] < n_visible[:, None].long()) & key_valid
    if allowed is not None:
        visible &= allowed
    return scores.masked_fill_(~visible, _NEG)


def candidate_mask(scores: torch.Tensor, n_visible: torch.Tensor, block: int, n_blocks: int) -> torch.Tensor:
    """scores [S, T] (-inf where not visible) -> bool [S, T]: the rows of each query's kept blocks."""
    S, T = scores.shape
    nb = -(-T // block)
    padded = torch.nn.functional.pad(scores, (0, nb * block - T), value=_NEG)
    b = padded.view(S, nb, block).amax(-1)
    newest = ((n_visible.long() - 1).clamp(min=0) // block)
    live = (n_visible > 0)[:, None]
    pinned = torch.where(live, float("inf"), b.gather(1, newest[:, None]))  # no host sync
    b.scatter_(1, newest[:, None], pinned)
    keep = min(n_blocks, nb)
    values, picks = torch.topk(b, keep, dim=-1)
    chosen = torch.zeros(S, nb, dtype=torch.bool, device=scores.device)
    chosen.scatter_(1, picks, torch.isfinite(values) | (values == float("inf")))
    return chosen.repeat_interleave(block, dim=1)[:, :T]


def select_sorted(scores: torch.Tensor, k: int, n_visible: torch.Tensor) -> torch.Tensor:
    """scores [S, T] -> int32 [S, k]: top min(k, n_visible) columns sorted ascending, -1 padded."""
    S, T = scores.shape
    live = min(k, T)
    out = torch.full((S, k), -1, dtype=torch.int32, device=scores.device)
    if live == 0:
        return out
    _, cols = torch.topk(scores, live, dim=-1)
    cols = torch.where(cols < n_visible[:, None].long(), cols, T + 1)  # past the visible rows: none
    cols = cols.sort(dim=-1).values
    out[:, :live] = torch.where(cols <= T, cols, -1).to(torch.int32)
    return out
