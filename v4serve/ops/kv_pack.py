"""Packed KV rows: public entry points (byte layouts in v4serve/formats.py, math in
kv_pack_reference.py, kernels in kv_pack_triton.py).

    pack_rows(x, fmt)                     x [N, dim] -> uint8 [N, fmt.row_bytes(dim)]
    unpack_rows(packed, fmt, dim, dtype)  uint8 [N, >= row_bytes] -> [N, dim] dtype
    store_rows(pool, rows, x, fmt)        pool[rows[i]] = pack_rows(x)[i] in place (rows[i] < 0: skipped)

unpack_rows(pack_rows(x)) == apply_kv_format(x) bit for bit for bf16 x (fp32 x: the RoPE tail is
stored in bf16). Every format runs Triton on CUDA (ue8m0: kv_pack_triton.py; fp4_e4m3_b16:
kv_pack_fp4_e4m3_triton.py).
"""

import torch

from v4serve.formats import RowFormat, row_format
from v4serve.ops._dispatch import use_triton
from v4serve.ops.kv_pack_reference import pack_rows_reference, store_rows_reference, unpack_rows_reference

__all__ = ["pack_rows", "store_rows", "unpack_rows"]


def _packed_format(fmt: "str | RowFormat") -> RowFormat:
    f = row_format(fmt)
    if not f.packed:
        raise ValueError(f"row format {f.name} is not a packed format")
    return f


def _fp4_e4m3_triton(impl: str, f: RowFormat, *tensors: torch.Tensor) -> bool:
    return f.name == "fp4_e4m3_b16" and use_triton(impl, *tensors)


def _triton_ok(impl: str, f: RowFormat, *tensors: torch.Tensor) -> bool:
    if not use_triton(impl, *tensors):
        return False
    if f.scale_kind != "ue8m0":
        if impl == "triton":
            raise ValueError(f"row format {f.name} has no Triton kernel (torch only)")
        return False
    return True


def pack_rows(x: torch.Tensor, fmt: "str | RowFormat", impl: str = "auto") -> torch.Tensor:
    """x [N, dim] (bf16 / fp32) -> uint8 [N, fmt.row_bytes(dim)], padding bytes zero."""
    f = _packed_format(fmt)
    if x.dim() != 2:
        raise ValueError(f"x must be [N, dim], got shape {tuple(x.shape)}")
    f.n_quant(x.shape[1])
    if _fp4_e4m3_triton(impl, f, x):
        from v4serve.ops.kv_pack_fp4_e4m3_triton import store_fp4_e4m3_rows_triton

        out = torch.zeros(x.shape[0], f.row_bytes(x.shape[1]), dtype=torch.uint8, device=x.device)
        store_fp4_e4m3_rows_triton(out, None, x, f)
        return out
    if _triton_ok(impl, f, x):
        from v4serve.ops.kv_pack_triton import store_rows_triton

        out = torch.zeros(x.shape[0], f.row_bytes(x.shape[1]), dtype=torch.uint8, device=x.device)
        store_rows_triton(out, None, x, f)
        return out
    return pack_rows_reference(x, f)


def unpack_rows(packed: torch.Tensor, fmt: "str | RowFormat", dim: int, dtype: torch.dtype = torch.bfloat16,
                impl: str = "auto") -> torch.Tensor:
    """uint8 [N, >= fmt.row_bytes(dim)] -> [N, dim] `dtype` (the values the rows hold)."""
    f = _packed_format(fmt)
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] < f.row_bytes(dim):
        raise ValueError(f"packed must be uint8 [N, >= {f.row_bytes(dim)}], got {packed.dtype} {tuple(packed.shape)}")
    if _fp4_e4m3_triton(impl, f, packed):
        from v4serve.ops.kv_pack_fp4_e4m3_triton import unpack_fp4_e4m3_rows_triton

        return unpack_fp4_e4m3_rows_triton(packed, f, dim, dtype)
    # The Triton unpack decodes the fp8 formats; "auto" decodes fp4 rows (V4.1's index keys) in torch.
    if (f.value_bits == 8 or impl == "triton") and _triton_ok(impl, f, packed):
        from v4serve.ops.kv_pack_triton import unpack_rows_triton

        return unpack_rows_triton(packed, f, dim, dtype)
    return unpack_rows_reference(packed, f, dim, dtype)


def check_pool(name: str, pool: torch.Tensor, f: RowFormat, dim: int) -> None:
    """A packed pool is uint8 [N, >= row_bytes(dim)] with contiguous rows."""
    if pool.dtype != torch.uint8 or pool.dim() != 2 or pool.shape[1] < f.row_bytes(dim) or pool.stride(1) != 1:
        raise ValueError(f"{name} must be uint8 [N, >= {f.row_bytes(dim)}] with contiguous rows for {f.name}, got "
                         f"{pool.dtype} {tuple(pool.shape)} strides {pool.stride()}")


def store_rows(pool: torch.Tensor, rows: torch.Tensor, x: torch.Tensor, fmt: "str | RowFormat",
               impl: str = "auto") -> None:
    """Quantize and pack x [N, dim] into pool[rows] (uint8 [P, >= row_bytes], in place); rows [N]
    int32 / int64, a negative row is skipped (padding of a captured step)."""
    f = _packed_format(fmt)
    if x.dim() != 2 or rows.shape != (x.shape[0],):
        raise ValueError(f"x must be [N, dim] and rows [N], got {tuple(x.shape)} and {tuple(rows.shape)}")
    check_pool("pool", pool, f, x.shape[1])
    if _fp4_e4m3_triton(impl, f, pool, rows, x):
        from v4serve.ops.kv_pack_fp4_e4m3_triton import store_fp4_e4m3_rows_triton

        store_fp4_e4m3_rows_triton(pool, rows, x, f)
        return
    if _triton_ok(impl, f, pool, rows, x):
        from v4serve.ops.kv_pack_triton import store_rows_triton

        store_rows_triton(pool, rows, x, f)
        return
    store_rows_reference(pool, rows, x, f)
