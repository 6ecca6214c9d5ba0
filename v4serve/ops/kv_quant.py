"""Row-format round trips: public entry points (math in kv_quant_reference.py).

The ue8m0 formats run a Triton kernel on CUDA (kv_quant_triton.py); fp4_e4m3_b16 is torch only.
`hadamard` (the indexer's rotation before its fp4 rounding) is its own op, re-exported here."""

import torch

from v4serve.formats import row_format
from v4serve.ops._dispatch import use_triton
from v4serve.ops.kv_quant_reference import (
    fp4_e2m1_e4m3_round_trip,
    fp4_e2m1_ue8m0_round_trip,
    fp8_e4m3_ue8m0_round_trip,
)
from v4serve.ops.hadamard import hadamard
from v4serve.ops.kv_quant_triton import ue8m0_round_trip_triton

__all__ = ["apply_kv_format", "hadamard"]


def apply_kv_format(x: torch.Tensor, format_name: str, impl="auto") -> torch.Tensor:
    """x [..., dim] -> the values a row of that format holds after storing x, in x.dtype.

    `bf16` returns x unchanged. The indexer's fp4_e8m0_b32 expects x already rotated by `hadamard`.
    """
    fmt = row_format(format_name)
    if fmt.name == "bf16":
        return x
    fmt.row_bytes(x.shape[-1])  # validates that the row fits the format
    n_quant = x.shape[-1] - fmt.plain_tail
    if use_triton(impl, x) and fmt.name != "fp4_e4m3_b16":
        return ue8m0_round_trip_triton(x, fmt.block, n_quant, fp4=fmt.value_bits == 4)
    if fmt.value_bits == 8:
        return fp8_e4m3_ue8m0_round_trip(x, fmt.block, n_quant)
    if fmt.name == "fp4_e8m0_b32":
        return fp4_e2m1_ue8m0_round_trip(x, fmt.block)
    return fp4_e2m1_e4m3_round_trip(x, fmt.block)
