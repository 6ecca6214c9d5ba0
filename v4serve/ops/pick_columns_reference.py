"""A decode step's attention columns from the indexer's ranking: the torch reference.

    out[b, :W]      = prefix[b, :]                         (the window columns)
    out[b, W + j]   = rows_of[b, order[b, j]]   j < k       (the k best-ranked compressed rows)

prefix [B, W] int32, rows_of [B, T] int32 (a sequence's compressed-pool rows), order [B, >= k]
int64 columns of rows_of, best first (the sort's indices); out [B, W + k] int32.
"""

import torch


def pick_columns_reference(prefix: torch.Tensor, rows_of: torch.Tensor, order: torch.Tensor, k: int) -> torch.Tensor:
    return torch.cat((prefix, rows_of.gather(1, order[:, :k])), dim=1)
