"""The rows a prefill step reads, unpacked once into a small bf16 pool.

A prefill query reads its own n_window + K rows, and every compressed row is in the top-k of many
queries (at S2048 r4, a row is read by ~2048 * 512 / 512 queries on average). Dequantizing packed
rows inside the attention kernel therefore repeats the work per (query, row) pair, and the bf16
kernels (the warp-specialised one on sm_90) cannot read packed rows at all. Prefill instead
unpacks each row it references exactly once:

    used   = the distinct rows of `pool` named by `cols` (-1 = hole), in increasing order
    slot[r] = the position of row r in `used` (only read for used rows)
    rows'  = unpack(pool[used])               [len(used), D] bf16, exact (kv_pack.unpack_rows)
    cols'  = slot[cols] where cols >= 0, else -1

so attention over (rows', cols') sees the same values in the same column order as over the
unpacked pool: the same output bits as the bf16 kernel over every row unpacked. Cost: one int32
slot table over the pool (a memset of 4 B per pool row), the gather and unpack of the used rows,
a remap of the column table, and one host sync (the number of used rows sizes the bf16 pool), so
it is for eager steps only (sparse_attn_triton keeps the in-kernel dequantization while a CUDA
graph is being captured).
"""

from __future__ import annotations

import torch

from v4serve.formats import RowFormat
from v4serve.ops.kv_pack import unpack_rows


def unpack_referenced_rows(pool: torch.Tensor, cols: torch.Tensor, fmt: RowFormat, dim: int,
                           dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """pool uint8 [N, >= row_bytes] packed rows, cols int32 [T, c] rows of pool or -1 ->
    (the referenced rows unpacked [U, dim] `dtype`, cols renumbered into them, int32 [T, c])."""
    n = pool.shape[0]
    live = cols >= 0
    named = cols[live].long()
    used = torch.zeros(n, dtype=torch.bool, device=pool.device)
    used[named] = True
    rows = used.nonzero().squeeze(1)  # the host sync: U sizes the unpacked pool
    slot = torch.empty(n, dtype=torch.int32, device=pool.device)
    slot[rows] = torch.arange(rows.numel(), dtype=torch.int32, device=pool.device)
    renumbered = torch.full_like(cols, -1)
    renumbered[live] = slot[named]
    unpacked = unpack_rows(pool[rows], fmt, dim, dtype) if rows.numel() else pool.new_zeros(0, dim, dtype=dtype)
    return unpacked, renumbered
