"""Engram table lookup (DeepSeek-V4.1): public entry point (math in engram_lookup_reference.py,
kernel in engram_lookup_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.engram_lookup_reference import SCALE_BLOCK, engram_lookup_reference
from v4serve.ops.engram_lookup_triton import engram_lookup_triton


def engram_lookup(table: torch.Tensor, table_scale: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype,
                  impl: str = "auto") -> torch.Tensor:
    """table float8_e4m3fn [N, head_dim] and table_scale uint8 [N, head_dim / 32] (on the device or in
    host memory, pinned for the kernel), rows int64 [T, R] -> dequantized rows [T, R * head_dim]
    `dtype` on rows' device. "auto" runs the kernel for CUDA rows: it reads a pinned host table in
    place (no host sync: capturable); the reference moves the rows to the table first."""
    if table.dim() != 2 or table.dtype != torch.float8_e4m3fn or table.shape[1] % SCALE_BLOCK:
        raise ValueError(f"table must be float8_e4m3fn [N, head_dim] with head_dim a multiple of {SCALE_BLOCK}, got "
                         f"{table.dtype} {tuple(table.shape)}")
    if table_scale.shape != (table.shape[0], table.shape[1] // SCALE_BLOCK) or table_scale.dtype != torch.uint8:
        raise ValueError(f"table_scale must be uint8 [{table.shape[0]}, {table.shape[1] // SCALE_BLOCK}], got "
                         f"{table_scale.dtype} {tuple(table_scale.shape)}")
    if rows.dim() != 2 or rows.dtype != torch.int64:
        raise ValueError(f"rows must be int64 [T, R], got {rows.dtype} {tuple(rows.shape)}")
    if use_triton(impl, rows):
        for name, t in (("table", table), ("table_scale", table_scale)):
            if rows.is_cuda and not (t.is_cuda or t.is_pinned()):
                raise ValueError(f"the Engram kernel reads {name} where it lives: on the GPU or in pinned host memory")
        return engram_lookup_triton(table, table_scale, rows, dtype, SCALE_BLOCK)
    return engram_lookup_reference(table, table_scale, rows, dtype)
