"""DeepSeek-V4.1 indexer: scores over packed fp4 (or bf16) index keys in full and candidate mode,
and the device-side selection (math: v41_index_reference.py; kernels: v41_index_triton.py).

    v41_index_scores(q, w, k_pool, key_rows, n_visible[, cand_blocks])   -> bf16 [B, S, C]
    candidate_blocks(scores, n_visible, block, n_blocks)                 -> int32 [S, keep]
    select_candidates(scores, cand_blocks, block, k, n_visible)          -> int32 [S, k]
    select_sorted(scores, k, n_visible)                                  -> int32 [S, k]

Full mode (Full layers) scores column t of every query against key row key_rows[b, t]; candidate
mode (Reindex layers after the candidate source) scores only the query's candidates: output slot
c holds column cand_blocks[b, s, c // block] * block + c % block. A candidate source turns its
full-mode scores into its kept blocks with `candidate_blocks` (block max, newest block pinned, top
min(n_blocks, #blocks) blocks with a finite score, ascending, -1 after them); a Reindex layer picks
its top-k columns with `select_candidates`. Every step runs on the device without a host sync.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from v4serve.formats import row_format as _row_format
from v4serve.ops._dispatch import use_triton
from v4serve.ops.kv_pack_reference import unpack_rows_reference
from v4serve.ops.v41_index_reference import candidate_mask, index_scores_v41, select_sorted

__all__ = ["v41_index_scores", "candidate_blocks", "select_candidates", "select_sorted", "candidate_mask",
           "index_scores_v41"]

_NEG = float("-inf")


def _check(q, weights, k_pool, key_rows, n_visible, fmt, cand_blocks):
    if q.dim() != 4:
        raise ValueError(f"q must be [B, S, H, D], got {tuple(q.shape)}")
    B, S, H, D = q.shape
    if H < 1:
        raise ValueError("q must have at least one head")
    if weights.shape != (B, S, H):
        raise ValueError(f"weights must be [{B}, {S}, {H}], got {tuple(weights.shape)}")
    if fmt is not None:
        if fmt.name != "fp4_e8m0_b32" or D % 32:
            raise ValueError(f"packed index keys must be fp4_e8m0_b32 rows of a multiple of 32 channels, got "
                             f"{fmt.name} with D = {D}")
        if k_pool.dtype != torch.uint8 or k_pool.dim() != 2 or k_pool.shape[1] < fmt.row_bytes(D):
            raise ValueError(f"k_pool must be uint8 [N, >= {fmt.row_bytes(D)}], "
                             f"got {k_pool.dtype} {tuple(k_pool.shape)}")
    elif k_pool.dim() != 2 or k_pool.shape[1] != D:
        raise ValueError(f"k_pool must be [N, {D}], got {tuple(k_pool.shape)}")
    if key_rows.dtype != torch.int32 or key_rows.dim() != 2 or key_rows.shape[0] != B:
        raise ValueError(f"key_rows must be int32 [{B}, R], got {key_rows.dtype} {tuple(key_rows.shape)}")
    if n_visible.dtype != torch.int32 or n_visible.shape != (B, S):
        raise ValueError(f"n_visible must be int32 [{B}, {S}], got {n_visible.dtype} {tuple(n_visible.shape)}")
    if cand_blocks is not None and (cand_blocks.dtype != torch.int32 or cand_blocks.dim() != 3
                                    or cand_blocks.shape[:2] != (B, S)):
        raise ValueError(f"cand_blocks must be int32 [{B}, {S}, NB], "
                         f"got {cand_blocks.dtype} {tuple(cand_blocks.shape)}")


def v41_index_scores(q: torch.Tensor, weights: torch.Tensor, k_pool: torch.Tensor, key_rows: torch.Tensor,
                     n_visible: torch.Tensor, row_format: str | None = None, cand_blocks: torch.Tensor | None = None,
                     cand_block: int = 8, impl: str = "auto", kernel: str = "auto") -> torch.Tensor:
    """bf16 [B, S, C]: the V4.1 index scores (v41_index_reference.py), -inf where masked.

    q [B, S, H, D] (fp4-rounded values), weights [B, S, H] (bf16 values, scales folded in); k_pool
    uint8 [N, >= 68] packed fp4_e8m0_b32 rows (row_format "fp4_e8m0_b32") or [N, D] values;
    key_rows [B, R] int32 pool row of each compressed row of the sequence (-1: a hole);
    n_visible [B, S] int32. Full mode: C = R, column t. Candidate mode: cand_blocks [B, S, NB]
    int32 block ids (-1: none), C = NB * cand_block. `kernel` picks the Triton kernel (tests and
    benchmarks): "auto" (tiles for a full-mode prefill, stream otherwise), "tiles", "stream",
    "stream_predecoded", "rows" or "rows_predecoded" (v41_index_triton.v41_index_scores_triton).
    Decode and candidate mode on a GPU with programmatic dependent launch read key_rows, n_visible and
    cand_blocks while the kernel launched right before may still run: that kernel must not write them
    (the model's come from the step plan and the candidate source; q, weights and k_pool may be its output).
    """
    fmt = None if row_format is None else _row_format(row_format)
    if fmt is not None and not fmt.packed:
        fmt = None
    _check(q, weights, k_pool, key_rows, n_visible, fmt, cand_blocks)
    weights = weights.to(torch.bfloat16)
    if use_triton(impl, q, weights, k_pool, key_rows, n_visible):
        from v4serve.ops.v41_index_triton import v41_index_scores_triton

        if q.dtype != torch.bfloat16 or (fmt is None and k_pool.dtype != torch.bfloat16):
            raise ValueError(f"the Triton kernels take bf16 q and bf16 or packed keys, got {q.dtype}, {k_pool.dtype}")
        return v41_index_scores_triton(q, weights, k_pool, key_rows, n_visible, fmt is not None, cand_blocks,
                                       cand_block, kernel)
    return _scores_torch(q, weights, k_pool, key_rows, n_visible, fmt, cand_blocks, cand_block)


def _scores_torch(q, weights, k_pool, key_rows, n_visible, fmt, cand_blocks, cand_block):
    B, S, H, D = q.shape
    R = key_rows.shape[1]
    C = R if cand_blocks is None else cand_blocks.shape[2] * cand_block
    out = torch.empty(B, S, C, dtype=torch.bfloat16, device=q.device)
    for b in range(B):
        rows = key_rows[b].long()
        if k_pool.shape[0] == 0:
            keys = torch.zeros(R, D, dtype=torch.bfloat16, device=q.device)
        elif fmt is None:
            keys = k_pool[rows.clamp(min=0)]
        else:
            keys = unpack_rows_reference(k_pool[rows.clamp(min=0)], fmt, D, torch.bfloat16)
        if cand_blocks is None:
            scores = index_scores_v41(q[b], weights[b], keys, rows >= 0, n_visible[b])
        else:
            blocks = cand_blocks[b].long().repeat_interleave(cand_block, dim=1)  # [S, C]
            cols = blocks * cand_block + torch.arange(C, device=q.device) % cand_block
            valid = (blocks >= 0) & (cols < n_visible[b, :, None].long()) & (cols < R)
            cols = torch.where(valid, cols, 0).clamp(max=max(R - 1, 0))
            valid &= (rows[cols] >= 0) if R else valid
            picked = keys[cols] if R else torch.zeros(S, C, D, dtype=keys.dtype, device=q.device)
            everything = torch.full((S,), C, dtype=torch.int32, device=q.device)
            scores = index_scores_v41(q[b], weights[b], picked, valid, everything)
        out[b] = scores.to(torch.bfloat16)
    return out


def candidate_blocks(scores: torch.Tensor, n_visible: torch.Tensor, block: int, n_blocks: int) -> torch.Tensor:
    """A candidate source's kept blocks: scores [S, T] (full mode, -inf where masked) -> int32
    [S, min(n_blocks, ceil(T / block))] block ids, ascending, then -1 for the blocks not kept (no
    finite score). The blocks of `candidate_mask`, as a list."""
    S, T = scores.shape
    nb = -(-T // block)
    b = F.pad(scores, (0, nb * block - T), value=_NEG).view(S, nb, block).amax(-1).float()
    newest = (n_visible.long() - 1).clamp(min=0) // block
    live = (n_visible > 0)[:, None]
    b.scatter_(1, newest[:, None], torch.where(live, float("inf"), b.gather(1, newest[:, None])))
    values, picks = torch.topk(b, min(n_blocks, nb), dim=-1)
    ids = torch.where(values > _NEG, picks, nb).sort(dim=-1).values
    return torch.where(ids < nb, ids, -1).to(torch.int32)


def select_candidates(scores: torch.Tensor, cand_blocks: torch.Tensor, block: int, k: int,
                      n_visible: torch.Tensor) -> torch.Tensor:
    """A Reindex layer's selection: candidate-mode scores [S, C] over the slots of cand_blocks
    [S, NB] -> int32 [S, k]: the columns of the top min(k, C) slots, ascending, -1 for masked picks
    and the unused tail (the columns `select_sorted` picks from the candidate-masked full scores)."""
    S, C = scores.shape
    out = torch.full((S, k), -1, dtype=torch.int32, device=scores.device)
    live = min(k, C)
    if live == 0:
        return out
    values, slots = torch.topk(scores, live, dim=-1)
    blocks = cand_blocks.long().gather(1, slots // block)
    cols = blocks * block + slots % block
    big = torch.iinfo(torch.int64).max
    ok = (values > _NEG) & (blocks >= 0) & (cols < n_visible[:, None].long())
    cols = torch.where(ok, cols, big).sort(dim=-1).values
    out[:, :live] = torch.where(cols < big, cols, -1).to(torch.int32)
    return out
