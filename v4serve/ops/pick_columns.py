"""The decode step's attention columns of a CSA layer (window columns, then the indexer's top-k
compressed rows): public entry point (math in pick_columns_reference.py, kernel in
pick_columns_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.pick_columns_reference import pick_columns_reference
from v4serve.ops.pick_columns_triton import pick_columns_triton


def pick_columns(prefix: torch.Tensor, rows_of: torch.Tensor, order: torch.Tensor, k: int,
                 impl: str = "auto") -> torch.Tensor:
    """int32 [B, W + k]: prefix [B, W] int32, then rows_of [B, T] int32 at the first k columns of
    order [B, >= k] int64 (each in [0, T)): cat(prefix, rows_of.gather(1, order[:, :k]))."""
    if prefix.dim() != 2 or rows_of.dim() != 2 or order.dim() != 2:
        raise ValueError(f"prefix, rows_of and order must be 2-D, got {tuple(prefix.shape)}, {tuple(rows_of.shape)} "
                         f"and {tuple(order.shape)}")
    if prefix.dtype != torch.int32 or rows_of.dtype != torch.int32 or order.dtype != torch.int64:
        raise ValueError(f"prefix and rows_of must be int32 and order int64, got {prefix.dtype}, {rows_of.dtype} and "
                         f"{order.dtype}")
    B = prefix.shape[0]
    if rows_of.shape[0] != B or order.shape[0] != B or not 0 <= k <= order.shape[1]:
        raise ValueError(f"rows_of and order must have {B} rows and order >= k = {k} columns, got "
                         f"{tuple(rows_of.shape)} and {tuple(order.shape)}")
    if use_triton(impl, prefix, rows_of, order):
        if prefix.stride(1) != 1 or rows_of.stride(1) != 1 or order.stride(1) != 1:
            prefix, rows_of, order = prefix.contiguous(), rows_of.contiguous(), order.contiguous()
        return pick_columns_triton(prefix, rows_of, order, k)
    return pick_columns_reference(prefix, rows_of, order, k)
