"""Torch reference of the lightning indexer's scores and top-k.

    score[b, s, t] = sum_h weights[b, s, h] * relu(q[b, s, h] . k_pool[key_rows[b, t]])

in fp32, and -inf where t >= n_visible[b, s] or key_rows[b, t] == -1 (a hole). `weights` carries
every scale factor but the constant `weight_scale`, which multiplies it first (fp32). Work is
chunked over query tokens to bound the [S, H, T] logits.
Packed keys (row_format given, k_pool uint8 [N, >= row_bytes(Dk)]) are unpacked to bf16 first.
"""

import torch

from v4serve.ops.kv_pack_reference import unpack_rows_reference

_LOGITS_BUDGET_ELEMENTS = 1 << 24


def visible_keys(key_rows: torch.Tensor, n_visible: torch.Tensor) -> torch.Tensor:
    """Bool [B, S, T]: which (query, key) pairs are scored."""
    t = torch.arange(key_rows.shape[1], device=key_rows.device)
    return (t[None, None, :] < n_visible[..., None].to(torch.int64)) & (key_rows[:, None, :] >= 0)


def index_scores_reference(q, weights, k_pool, key_rows, n_visible, row_format=None, weight_scale=1.0):
    B, S, H, Dk = q.shape
    if weight_scale != 1.0:
        weights = weights.float() * weight_scale
    T = key_rows.shape[1]
    if k_pool.shape[0] == 0 or T == 0:
        keys = torch.zeros(B, T, Dk, dtype=torch.float32, device=q.device)
    elif row_format is None:
        keys = k_pool[key_rows.clamp(min=0).to(torch.int64)].float()
    else:
        picked = k_pool[key_rows.clamp(min=0).to(torch.int64)].reshape(B * T, k_pool.shape[1])
        keys = unpack_rows_reference(picked, row_format, Dk, torch.bfloat16).float().reshape(B, T, Dk)
    out = torch.empty(B, S, T, dtype=torch.float32, device=q.device)
    chunk = max(1, _LOGITS_BUDGET_ELEMENTS // max(1, B * H * T))
    for s in range(0, S, chunk):
        logits = torch.einsum("bshd,btd->bsht", q[:, s : s + chunk].float(), keys).relu_()
        out[:, s : s + chunk] = torch.einsum("bsht,bsh->bst", logits, weights[:, s : s + chunk].float())
    return out.masked_fill_(~visible_keys(key_rows, n_visible), float("-inf"))

