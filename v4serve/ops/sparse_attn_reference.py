"""Torch reference of paged sparse attention (the engine's CPU path and the kernels' oracle).

For each query token (b, m) and head h, over the columns c of idx[b, m] that are live:

    l_c   = scale * q[b, m, h] . kv_c                    kv_c = win_pool[idx] if c < n_window
                                                               else cmp_pool[idx]
    m     = max(max_c l_c, sink[h])
    o     = sum_c exp(l_c - m) kv_c / (sum_c exp(l_c - m) + exp(sink[h] - m))

A column is live when idx >= 0 and, for compressed columns c = n_window + j, j < counts[b, m].
Taking the sink into the running max changes nothing mathematically and keeps a query whose
columns are all holes at exactly 0. Logits and softmax run in fp32; the output is q.dtype.
Work is chunked over query tokens so that the gathered rows stay near 64 MB.

Packed pools (row_format given, uint8 [N, >= row_bytes(D)]): the gathered rows are unpacked to
bf16 (kv_pack_reference.py), then the same math runs: attention over packed rows equals attention
over the unpacked bf16 rows.
"""

import torch

from v4serve.ops.kv_pack_reference import unpack_rows_reference

_GATHER_BUDGET_ELEMENTS = 1 << 24


def live_columns(idx: torch.Tensor, n_window: int, counts: torch.Tensor | None) -> torch.Tensor:
    """Bool [..., C]: which columns of idx take part in the softmax."""
    live = idx >= 0
    if counts is not None:
        j = torch.arange(idx.shape[-1], device=idx.device) - n_window
        live &= (j < 0) | (j < counts.unsqueeze(-1).to(torch.int64))
    return live


def _gather(pool: torch.Tensor, rows: torch.Tensor, row_format=None, dim: int = 0) -> torch.Tensor:
    width = pool.shape[1] if row_format is None else dim
    if rows.numel() == 0 or pool.shape[0] == 0:
        return torch.zeros(*rows.shape, width, dtype=torch.float32, device=pool.device)
    picked = pool[rows.clamp(min=0).to(torch.int64)]
    if row_format is None:
        return picked.float()
    flat = unpack_rows_reference(picked.reshape(-1, pool.shape[1]), row_format, dim, torch.bfloat16)
    return flat.float().reshape(*rows.shape, dim)


def sparse_attn_paged_reference(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts=None, row_format=None):
    B, M, H, D = q.shape
    C = idx.shape[-1]
    qf = q.reshape(B * M, H, D)
    idx_f = idx.reshape(B * M, C)
    live = live_columns(idx_f, n_window, None if counts is None else counts.reshape(B * M))
    sink_f = sink.float()
    out = torch.empty(B * M, H, D, dtype=q.dtype, device=q.device)
    chunk = max(1, _GATHER_BUDGET_ELEMENTS // max(1, C * D))
    for s in range(0, B * M, chunk):
        rows, ok = idx_f[s : s + chunk], live[s : s + chunk]
        kv = torch.cat([_gather(win_pool, rows[:, :n_window], row_format, D),
                        _gather(cmp_pool, rows[:, n_window:], row_format, D)], 1)
        logits = torch.einsum("nhd,ncd->nhc", qf[s : s + chunk].float(), kv) * scale
        logits = logits.masked_fill(~ok[:, None, :], float("-inf"))
        m = torch.maximum(logits.amax(-1), sink_f[None, :])
        p = torch.exp(logits - m[..., None])
        denom = p.sum(-1) + torch.exp(sink_f[None, :] - m)
        out[s : s + chunk] = (torch.einsum("nhc,ncd->nhd", p, kv) / denom[..., None]).to(q.dtype)
    return out.reshape(B, M, H, D)
