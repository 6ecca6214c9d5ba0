"""Triton kernels of packed KV rows (layouts: v4serve/formats.py; math: kv_pack_reference.py).

Placeholder of the API commit: the wrappers run the torch reference; the kernels follow."""

from v4serve.ops.kv_pack_reference import pack_rows_reference, store_rows_reference, unpack_rows_reference


def store_rows_triton(pool, rows, x, fmt):
    if rows is None:
        pool[:, : fmt.row_bytes(x.shape[1])] = pack_rows_reference(x, fmt)
        return
    store_rows_reference(pool, rows, x, fmt)


def unpack_rows_triton(packed, fmt, dim, dtype):
    return unpack_rows_reference(packed, fmt, dim, dtype)
