"""The rows a prefill step reads, unpacked once into a small bf16 pool.

A prefill query reads its own n_window + K rows, and every compressed row is in the top-k of many
queries (at S2048 r4, each row of the pool is read by ~hundreds of queries). Dequantizing packed
rows inside the attention kernel therefore repeats the work per (query, row) pair, and the bf16
kernels (the warp-specialised one on sm_90) cannot read packed rows at all. Prefill instead
unpacks each row it references exactly once. Rows are numbered across both pools (window row r
is g = r, compressed row r is g = N_w + r); with cols [T, C] naming window rows in the first
n_window columns and compressed rows in the rest (-1 = hole):

    used[g]  = 1 if some column names g          (a scatter into N_w + N_c + 1 flags, no sync)
    slot[g]  = cumsum(used)[g] - 1               (the row's place among the used rows)
    rows     = nonzero(used)                     [U] increasing (the one host sync: U sizes the pool)
    unpacked = unpack(pool_of(rows)[rows])       [U, D] bf16, exact (kv_pack.unpack_rows)
    cols'    = slot[g(cols)] where cols >= 0, else -1

Attention over (unpacked as both pools, cols') sees the same values in the same column order as
over the unpacked pools: the same output bits as the bf16 kernel over every row unpacked. Cost:
the flag and slot tables (5 B per pool row), the gather and unpack of the U used rows, the remap of
the column table, and one host sync, so it is for eager steps only (sparse_attn_triton keeps the
in-kernel dequantization while a CUDA graph is being captured).
"""

from __future__ import annotations

import torch

from v4serve.formats import RowFormat
from v4serve.ops.kv_pack import unpack_rows


def unpack_referenced_rows(win_pool: torch.Tensor, cmp_pool: torch.Tensor, cols: torch.Tensor, n_window: int,
                           fmt: RowFormat, dim: int, dtype: torch.dtype = torch.bfloat16
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """win_pool, cmp_pool uint8 [N_w | N_c, >= row_bytes] packed rows; cols int32 [T, C] (the first
    n_window columns name win_pool rows, the rest cmp_pool rows; -1 = hole) ->
    (the referenced rows unpacked [U, dim] `dtype`, cols renumbered into them, int32 [T, C])."""
    n_w, n_c = win_pool.shape[0], cmp_pool.shape[0]
    device = cols.device
    live = cols >= 0
    offset = torch.full((cols.shape[-1],), n_w, dtype=torch.int64, device=device)
    offset[:n_window] = 0
    hole = n_w + n_c  # a flag past every row, for the holes
    g = torch.where(live, cols.long() + offset, hole)
    used = torch.zeros(hole + 1, dtype=torch.int32, device=device)
    used[g] = 1
    used[hole] = 0
    slot = (torch.cumsum(used, 0, dtype=torch.int32) - 1)
    rows = used.nonzero().squeeze(1)  # the host sync
    renumbered = torch.where(live, slot[g], -1).to(torch.int32)
    if rows.numel() == 0:
        return win_pool.new_zeros(0, dim, dtype=dtype), renumbered
    width = min(win_pool.shape[1], cmp_pool.shape[1]) if n_w and n_c else (win_pool if n_w else cmp_pool).shape[1]
    if n_w and n_c:
        in_window = (rows < n_w)[:, None]
        packed = torch.where(in_window, win_pool[rows.clamp(max=n_w - 1), :width],
                             cmp_pool[(rows - n_w).clamp(min=0), :width])
    else:
        packed = (win_pool[rows] if n_w else cmp_pool[rows - n_w])[:, :width]
    return unpack_rows(packed.contiguous(), fmt, dim, dtype), renumbered
