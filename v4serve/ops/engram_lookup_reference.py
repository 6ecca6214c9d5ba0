"""Torch reference of the Engram table lookup (DeepSeek-V4.1, model/engram.py): gather the step's
table rows and dequantize them.

    table       e4m3 codes   [N, head_dim]            (float8_e4m3fn)
    table_scale ue8m0 bytes  [N, head_dim / 32]        (uint8 b: the scale 2^(b - 127))
    rows        int64        [T, R]                    (table rows of the step's tokens)
    out[t, r * head_dim + c] = e4m3(table[rows[t, r], c]) * 2^(table_scale[rows[t, r], c // 32] - 127)

as `dtype` [T, R * head_dim] on rows' device (every product is exact: a 4-bit significand times a
power of two). The reference gathers where the table lives (host memory for V4.1-Flash's tables)
and moves the gathered rows to rows' device: with a host table and CUDA rows that is a
device-to-host copy of `rows` (a synchronisation), which the Triton kernel avoids."""

import torch

SCALE_BLOCK = 32  # table channels per ue8m0 scale


def engram_lookup_reference(table: torch.Tensor, table_scale: torch.Tensor, rows: torch.Tensor,
                            dtype: torch.dtype) -> torch.Tensor:
    flat = rows.to(table.device).flatten()
    codes = table[flat].to(rows.device)
    exponents = table_scale[flat].to(rows.device)
    scale = torch.exp2(exponents.float() - 127).repeat_interleave(SCALE_BLOCK, dim=1)
    return (codes.float() * scale).to(dtype).view(rows.shape[0], rows.shape[1] * table.shape[1])
