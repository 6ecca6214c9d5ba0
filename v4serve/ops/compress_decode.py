"""One compressor decode step (record the token, pool a completed block, kv_norm, RoPE, target row):
public entry point (math in compress_decode_reference.py, kernel in compress_decode_triton.py)."""

from __future__ import annotations

import torch

from v4serve.formats import row_format as row_format_of
from v4serve.ops._dispatch import use_triton
from v4serve.ops.hadamard_reference import check_hadamard_dim, hadamard_reference
from v4serve.ops.kv_pack import check_pool
from v4serve.ops.kv_pack_reference import store_rows_reference
from v4serve.ops.compress_decode_reference import compress_decode_reference
from v4serve.ops.compress_decode_triton import compress_decode_triton


def compress_decode(
    kv: torch.Tensor, score: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
    position_bias: torch.Tensor, state: tuple[torch.Tensor, ...], ratio: int, norm_weight: torch.Tensor,
    eps: float, cos: torch.Tensor, sin: torch.Tensor, rows_of: torch.Tensor, scratch: int, out_dtype: torch.dtype,
    impl: str = "auto", pool: torch.Tensor | None = None, row_format=None, hadamard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold one token per sequence into its compressor `state` (updated in place: (kv, score) for an
    overlapping compressor, (max, sum, acc) for an online one) and return (rows [B, d] out_dtype,
    target [B] int64): the finished row of every block the step completes (zeros elsewhere) and
    the compressed-pool row it goes to (`scratch` where none).

    Packed output: with `pool` (uint8 [P, >= row_bytes(d)]) and a packed `row_format`, the step
    also quantizes and packs every row into pool[target] (kv_pack.py layout; the scratch row gets
    the zero rows of sequences that completed no block): the cache write of the step, fused.

    `hadamard`: the rows (in out_dtype) go through the normalised Walsh-Hadamard transform
    (`ops/hadamard.py`; d a power of two) before they are returned and packed: the indexer's keys."""
    fmt = check_compress_inputs(kv, score, position_bias, state, ratio, norm_weight, cos, sin, pool, row_format,
                                hadamard)
    if kv.stride(0) != score.stride(0):  # the kernel reads both with one row stride
        kv, score = kv.contiguous(), score.contiguous()
    if use_triton(impl, kv, score, *state):
        return compress_decode_triton(kv, score, positions, slots, position_bias, state, ratio, norm_weight, eps,
                                      cos, sin, rows_of, scratch, out_dtype, pool=pool, row_format=fmt,
                                      hadamard=hadamard)
    rows, target = compress_decode_reference(kv, score, positions, slots, position_bias, state, ratio, norm_weight,
                                             eps, cos, sin, rows_of, scratch, out_dtype)
    if hadamard:
        rows = hadamard_reference(rows)
    if fmt is not None:
        store_rows_reference(pool, target, rows, fmt)
    return rows, target


def check_compress_inputs(kv, score, position_bias, state, ratio, norm_weight, cos, sin, pool, row_format,
                          hadamard):
    """Raise a clear error for inputs a compressor step cannot take; returns the packed RowFormat (or None)."""
    B, d = kv.shape[0], norm_weight.shape[0]
    width = (2 if len(state) == 2 else 1) * d
    for name, t in (("kv", kv), ("score", score)):
        if t.shape != (B, width) or t.dtype != torch.float32 or t.stride(1) != 1:
            raise ValueError(f"{name} must be fp32 [{B}, {width}] with unit column stride, got {t.dtype} "
                             f"{tuple(t.shape)} strides {t.stride()}")
    if position_bias.shape != (ratio, width):
        raise ValueError(f"position_bias must be [{ratio}, {width}], got {tuple(position_bias.shape)}")
    if cos.shape != sin.shape or cos.shape[0] != B or 2 * cos.shape[1] > d:
        raise ValueError(f"cos and sin must be [{B}, R] with 2R <= {d}, got {tuple(cos.shape)}, {tuple(sin.shape)}")
    fmt = None
    if pool is not None:
        fmt = row_format_of(row_format)
        if not fmt.packed:
            raise ValueError(f"row_format must be a packed format when pool is given, got {fmt.name}")
        check_pool("pool", pool, fmt, d)
    if hadamard:
        check_hadamard_dim(d)
    return fmt
