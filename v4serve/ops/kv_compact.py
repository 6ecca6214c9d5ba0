"""The rows a prefill step reads, unpacked once into a small bf16 pool, with no host sync.

A prefill query reads its own n_window + K rows, and every compressed row is in the top-k of many
queries (at S2048 r4, each row of the pool is read by ~hundreds of queries). Dequantizing packed
rows inside the attention kernel therefore repeats the work per (query, row) pair, and the bf16
kernels (the warp-specialised one on sm_90) cannot read packed rows at all. Prefill instead
unpacks each row it references exactly once. Rows are numbered across both pools (window row r
is g = r, compressed row r is g = N_w + r); with cols [T, C] naming window rows in the first
n_window columns and compressed rows in the rest (-1 = hole; with counts, the columns
c >= n_window + counts[t] are dead too, as in the attention kernels):

    used[g]  = 1 if some live column names g
    slot[g]  = cumsum(used)[g] - 1               (the row's place among the used rows, pool order)
    rows     = unpack(row g) at rows[slot[g]]    [R, D] bf16, exact (kv_pack's dequantization)
    cols'    = slot[g(cols)] on live columns, else -1

Attention over (rows as both pools, cols') sees the same values in the same column order as over
the unpacked pools: the same output bits as the bf16 kernel over every row unpacked.

The size of `rows` is a bound R on the number U of used rows, known on the host (so no sync and
the sequence is CUDA-graph capturable): `max_rows` from the step (model/step_plan.py: each
sequence's window rows plus its compressed rows), else `shape_bound` (every pool row, or every
live-able column, whichever is fewer). Rows [U, R) are left unwritten. A bound below U drops the
rows whose slot would be >= R (their columns become holes) and never writes out of range.
"""

from __future__ import annotations

import torch

from v4serve.formats import RowFormat
from v4serve.ops._dispatch import use_triton
from v4serve.ops.kv_compact_reference import unpack_referenced_rows_reference


def shape_bound(n_pool_rows: int, cols: torch.Tensor) -> int:
    """A bound on the distinct rows `cols` can name, from shapes alone: at least 1 (a valid pool)."""
    return max(1, min(n_pool_rows, cols.numel()))


def unpack_referenced_rows(win_pool: torch.Tensor, cmp_pool: torch.Tensor, cols: torch.Tensor, n_window: int,
                           fmt: RowFormat, dim: int, dtype: torch.dtype = torch.bfloat16,
                           counts: torch.Tensor | None = None, max_rows: int | None = None, impl: str = "auto",
                           cmp_fmt: RowFormat | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """win_pool, cmp_pool uint8 [N_w | N_c, >= row_bytes] packed rows (window rows in `fmt`,
    compressed rows in `cmp_fmt`, None: `fmt` too; DeepSeek-V4.1 stores two); cols int32 [T, C] (the first
    n_window columns name win_pool rows, the rest cmp_pool rows; -1 = hole); counts int32 [T]
    (optional live compressed columns per token) ->
    (rows [R, dim] `dtype`: the used rows unpacked in pool order, then R - U unwritten rows;
     cols renumbered into them, int32 [T, C], -1 on every dead column)."""
    if cols.dtype != torch.int32 or cols.dim() != 2:
        raise ValueError(f"cols must be int32 [T, C], got {cols.dtype} {tuple(cols.shape)}")
    if counts is not None and counts.numel() != cols.shape[0]:
        raise ValueError(f"counts must hold one count per token ({cols.shape[0]}), got {tuple(counts.shape)}")
    n_rows = win_pool.shape[0] + cmp_pool.shape[0]
    max_rows = shape_bound(n_rows, cols) if max_rows is None else max(1, min(int(max_rows), shape_bound(n_rows, cols)))
    if use_triton(impl, win_pool, cmp_pool, cols):
        from v4serve.ops.kv_compact_triton import unpack_referenced_rows_triton

        return unpack_referenced_rows_triton(win_pool, cmp_pool, cols, n_window, fmt, dim, dtype, counts, max_rows,
                                             cmp_fmt=cmp_fmt)
    return unpack_referenced_rows_reference(win_pool, cmp_pool, cols, n_window, fmt, dim, dtype, counts, max_rows,
                                            cmp_fmt)
