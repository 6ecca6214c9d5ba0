"""The compressor steps of a speculative verify step (k + 1 tokens per sequence): the torch reference.

A verify step feeds S sequences' tokens in G = k + 1 groups, group-major (token g * S + b is
sequence b's token at position starts[b] + g; `PagedKVCache.build_verify_batch`). The compressor
folds the groups in order, each exactly one decode step (`compress_decode_reference.py`: record
the token, pool a completed block, kv_norm, RoPE, target row), and keeps the rollback's undo
journal (`cache/state_checkpoints.py`): before group g >= 1 overwrites them, the sub-rows it
writes, as they are after group g - 1, and which they are:

    saved[g - 1, b * n + t, x] = state[t][slots[b], x]     for the sub-rows x in written[g - 1, b]
    written[g - 1, b] = sum of 2^x over the sub-rows x group g writes:
        overlap (state rows [2r, W]; p = the token's position, j = p mod r):
            row r + j, and rows 0 .. r - 1 when the token completes its block (j = r - 1)
        online (state rows [d], one sub-row): 1

n state tensors (2: kv, score; 3: max, sum, acc). This reference stores every sub-row of the
state in saved[g - 1] (a superset: the commit reads only those in `written`).

Returns the rows [G * S, d] and targets [G * S] of all groups, in token order.
"""

from __future__ import annotations

import torch

from v4serve.ops.hadamard_reference import hadamard_reference
from v4serve.ops.compress_decode_reference import compress_decode_reference
from v4serve.ops.kv_pack_reference import store_rows_reference


def overwritten_rows(positions: torch.Tensor, ratio: int, overlap: bool) -> torch.Tensor:
    """int32 bit masks [B] of the state sub-rows a decode step at `positions` writes (see above)."""
    if not overlap:
        return torch.ones_like(positions, dtype=torch.int32)
    j = positions % ratio
    previous_block = torch.where(j == ratio - 1, (1 << ratio) - 1, 0)
    return ((1 << (ratio + j)) | previous_block).to(torch.int32)


def compress_verify_reference(
    kv: torch.Tensor, score: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
    position_bias: torch.Tensor, state: tuple[torch.Tensor, ...], ratio: int, norm_weight: torch.Tensor,
    eps: float, cos: torch.Tensor, sin: torch.Tensor, rows_of: torch.Tensor, scratch: int, out_dtype: torch.dtype,
    groups: int, saved: torch.Tensor | None = None, written: torch.Tensor | None = None,
    pool: torch.Tensor | None = None, row_format=None, hadamard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    s, n = slots.shape[0], len(state)
    rows, targets = [], []
    for g in range(groups):
        at = slice(g * s, (g + 1) * s)
        if saved is not None and g > 0:
            for t, tensor in enumerate(state):
                saved[g - 1, torch.arange(s, device=slots.device) * n + t] = tensor[slots]
            written[g - 1, :s] = overwritten_rows(positions[at], ratio, n == 2)
        r, target = compress_decode_reference(kv[at], score[at], positions[at], slots, position_bias, state, ratio,
                                              norm_weight, eps, cos[at], sin[at], rows_of[at], scratch, out_dtype)
        if hadamard:
            r = hadamard_reference(r)
        if pool is not None:
            store_rows_reference(pool, target, r, row_format)
        rows.append(r)
        targets.append(target)
    return torch.cat(rows), torch.cat(targets)
