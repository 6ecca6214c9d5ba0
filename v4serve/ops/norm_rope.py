"""RMSNorm + interleaved partial RoPE: public entry point (math in norm_rope_reference.py, kernel in
norm_rope_triton.py). Every norm of the model and every rotation (q, kv, compressed rows, index
q, the output's inverse rotation) goes through `rms_norm_rope`."""

from __future__ import annotations

import torch

from v4serve.formats import row_format as row_format_of
from v4serve.ops._dispatch import use_triton
from v4serve.ops.hadamard_reference import check_hadamard_dim, hadamard_reference
from v4serve.ops.kv_pack import check_pool
from v4serve.ops.kv_pack_reference import store_rows_reference
from v4serve.ops.norm_rope_reference import rms_norm_reference, rms_norm_rope_reference
from v4serve.ops.norm_rope_triton import rms_norm_rope_pair_triton, rms_norm_rope_triton


def rms_norm_rope(
    x: torch.Tensor, eps: float | None = None, weight: torch.Tensor | None = None,
    cos: torch.Tensor | None = None, sin: torch.Tensor | None = None, inverse: bool = False, impl: str = "auto",
    pool: torch.Tensor | None = None, rows: torch.Tensor | None = None, row_format=None, hadamard: bool = False,
    also_norm: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMS-normalise the last dim of x [T, D] or [T, H, D] (eps None: no norm; weight [D] optional),
    then rotate its last 2R channels by the per-token angles cos, sin [T, R] fp32 (None: no
    rotation; `inverse` negates the angles). Returns x's shape and dtype.

    Packed output (the window append): with `pool` (uint8 [P, >= row_bytes(D)]), `rows` [T] int
    (a negative row is skipped) and a packed `row_format`, the result of x [T, D] is also quantized
    and packed into pool[rows] (kv_pack.py layout), in the same kernel on CUDA.

    `hadamard`: the result (in x's dtype) then goes through the normalised Walsh-Hadamard transform
    of its last dim (`ops/hadamard.py`; D a power of two), in the same kernel on CUDA: the index
    query's rotation, cast and transform as one launch instead of 1 + 24.

    `also_norm` = (x2 [T2, D2], weight2 [D2]): a second, independent weighted RMSNorm (same eps,
    no rotation) computed in the same launch on CUDA (the attention's q_a_norm beside its kv norm:
    one launch a layer fewer); x must then be [T, D] with a weight and no inverse / Hadamard.
    Returns (result, RMSNorm(x2)) instead of the result alone."""
    D = x.shape[-1]
    if weight is not None and (eps is None or weight.shape != (D,)):
        raise ValueError(f"weight must be [{D}] and come with eps, got {tuple(weight.shape)} with eps={eps}")
    if (cos is None) != (sin is None):
        raise ValueError("cos and sin must be given together")
    if cos is not None:
        if x.dim() < 2 or cos.dim() != 2 or cos.shape != sin.shape or cos.shape[0] != x.shape[0]:
            raise ValueError(f"cos and sin must be [{x.shape[0]}, R] for x {tuple(x.shape)}, got "
                             f"{tuple(cos.shape)} and {tuple(sin.shape)}")
        if 2 * cos.shape[1] > D or (D - 2 * cos.shape[1]) % 2:
            raise ValueError(f"rope_dim {2 * cos.shape[1]} must be even-aligned within D = {D}")
    fmt = None
    if pool is not None:
        fmt = row_format_of(row_format)
        if not fmt.packed:
            raise ValueError(f"row_format must be a packed format when pool is given, got {fmt.name}")
        if x.dim() != 2 or rows is None or rows.shape != (x.shape[0],):
            raise ValueError(f"a packed store needs x [T, D] and rows [T], got {tuple(x.shape)} and "
                             f"{None if rows is None else tuple(rows.shape)}")
        check_pool("pool", pool, fmt, D)
    if hadamard:
        check_hadamard_dim(D)
    if also_norm is not None:
        x2, weight2 = also_norm
        if weight is None or inverse or hadamard or x.dim() != 2:
            raise ValueError("also_norm needs x [T, D] with eps and weight, without inverse or hadamard")
        if x2.dim() != 2 or weight2.shape != (x2.shape[-1],):
            raise ValueError(f"also_norm must be (x2 [T2, D2], weight2 [D2]), got {tuple(x2.shape)} and "
                             f"{tuple(weight2.shape)}")
        if use_triton(impl, x):
            return rms_norm_rope_pair_triton(x, eps, weight, cos, sin, x2, weight2, pool=pool, rows=rows,
                                             row_format=fmt)
        y = rms_norm_rope_reference(x, eps, weight, cos, sin)
        if fmt is not None:
            store_rows_reference(pool, rows, y, fmt)
        return y, rms_norm_reference(x2, eps, weight2)
    if use_triton(impl, x):
        return rms_norm_rope_triton(x, eps, weight, cos, sin, inverse, pool=pool, rows=rows, row_format=fmt,
                                    hadamard=hadamard)
    y = rms_norm_rope_reference(x, eps, weight, cos, sin, inverse)
    if hadamard:
        y = hadamard_reference(y)
    if fmt is not None:
        store_rows_reference(pool, rows, y, fmt)
    return y
