"""Torch reference of the row compaction (math: kv_compact.py). Readable, not fast: it finds the
used rows with `nonzero` (a host sync on the GPU); the Triton kernels (kv_compact_triton.py) do
the same without one."""

from __future__ import annotations

import torch

from v4serve.formats import RowFormat
from v4serve.ops.kv_pack_reference import unpack_rows_reference


def live_column_mask(cols: torch.Tensor, n_window: int, counts: torch.Tensor | None) -> torch.Tensor:
    """[T, C] bool: column c of token t names a row (cols >= 0, and c < n_window + counts[t] when
    counts are given: the attention kernels skip the columns past that)."""
    live = cols >= 0
    if counts is not None:
        c = torch.arange(cols.shape[1], device=cols.device)
        live &= c[None, :] < n_window + counts.reshape(-1, 1).clamp(min=0)
    return live


def unpack_referenced_rows_reference(win_pool: torch.Tensor, cmp_pool: torch.Tensor, cols: torch.Tensor,
                                     n_window: int, fmt: RowFormat, dim: int, dtype: torch.dtype,
                                     counts: torch.Tensor | None, max_rows: int, cmp_fmt: RowFormat | None = None
                                     ) -> tuple[torch.Tensor, torch.Tensor]:
    n_w, n_c = win_pool.shape[0], cmp_pool.shape[0]
    live = live_column_mask(cols, n_window, counts)
    is_window = torch.arange(cols.shape[1], device=cols.device) < n_window
    g = torch.where(is_window[None, :], cols.long(), cols.long() + n_w)  # the row's number across both pools
    used = torch.zeros(n_w + n_c, dtype=torch.bool, device=cols.device)
    used[g[live]] = True
    rows = used.nonzero().squeeze(1)  # pool order: window rows, then compressed rows
    slot = torch.full((n_w + n_c,), -1, dtype=torch.int64, device=cols.device)
    slot[rows] = torch.arange(rows.numel(), device=cols.device)
    slot[slot >= max_rows] = -1  # a bound too small drops the rows past it (never written out of range)
    renumbered = torch.where(live, slot[torch.where(live, g, 0)], -1).to(torch.int32)
    out = torch.zeros(max_rows, dim, dtype=dtype, device=cols.device)
    kept = rows[:max_rows]
    if kept.numel():  # each pool's rows in its own format (pool order: the window rows come first)
        is_win = kept < n_w
        win_rows, cmp_rows = kept[is_win], kept[~is_win] - n_w
        parts = ((0, win_pool, win_rows, fmt), (win_rows.numel(), cmp_pool, cmp_rows, cmp_fmt or fmt))
        for start, pool, rows, f in parts:
            if rows.numel():
                out[start: start + rows.numel()] = unpack_rows_reference(pool[rows], f, dim, dtype)
    return out, renumbered
