"""The compressor steps of a speculative verify step (k + 1 tokens per sequence): the torch reference.

A verify step feeds S sequences' tokens in G = k + 1 groups, group-major (token g * S + b is
sequence b's token at position starts[b] + g; `PagedKVCache.build_verify_batch`). The compressor
folds the groups in order, each exactly one decode step (`compress_decode_reference.py`: record
the token, pool a completed block, kv_norm, RoPE, target row), and after group g keeps a copy of
every sequence's state (the rollback's checkpoints, `cache/state_checkpoints.py`):

    saved[g, b * n + t] = state[t][slots[b]]        t < n state tensors (2: kv, score; 3: max, sum, acc)

Returns the rows [G * S, d] and targets [G * S] of all groups, in token order.
"""

from __future__ import annotations

import torch

from v4serve.ops.hadamard_reference import hadamard_reference
from v4serve.ops.compress_decode_reference import compress_decode_reference
from v4serve.ops.kv_pack_reference import store_rows_reference


def compress_verify_reference(
    kv: torch.Tensor, score: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
    position_bias: torch.Tensor, state: tuple[torch.Tensor, ...], ratio: int, norm_weight: torch.Tensor,
    eps: float, cos: torch.Tensor, sin: torch.Tensor, rows_of: torch.Tensor, scratch: int, out_dtype: torch.dtype,
    groups: int, saved: torch.Tensor | None = None, pool: torch.Tensor | None = None, row_format=None,
    hadamard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    s = slots.shape[0]
    rows, targets = [], []
    for g in range(groups):
        at = slice(g * s, (g + 1) * s)
        r, target = compress_decode_reference(kv[at], score[at], positions[at], slots, position_bias, state, ratio,
                                              norm_weight, eps, cos[at], sin[at], rows_of[at], scratch, out_dtype)
        if hadamard:
            r = hadamard_reference(r)
        if pool is not None:
            store_rows_reference(pool, target, r, row_format)
        rows.append(r)
        targets.append(target)
        if saved is not None:
            n = len(state)
            for t, tensor in enumerate(state):
                saved[g, torch.arange(s, device=slots.device) * n + t] = tensor[slots]
    return torch.cat(rows), torch.cat(targets)
