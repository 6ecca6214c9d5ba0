"""Triton kernel of the Engram table lookup (math: engram_lookup_reference.py), reading the table
where it lives without a host synchronisation.

The tables of V4.1-Flash (~183 GiB) stay in pinned host memory; CUDA's unified addressing gives a
pinned allocation the same address on the device, so the kernel gathers the step's rows straight
over the host link (zero-copy, as ops/expert_fetch_triton.py reads offloaded experts). The row ids
are read on the device, so the lookup is CUDA-graph capturable (a copy engine's addresses would be
fixed at capture, and gathering on the host would need the ids there first).

Layouts: codes uint8 [N, head_dim] (the e4m3 bytes; rows a multiple of 16 bytes: head_dim % 32 == 0
and the 16-byte alignment of row stride and base, asserted by the wrapper, keep each row 16-byte
loads); scales uint8 [N, head_dim / 32]; rows int64 [T * R] flat; out [T * R, head_dim] bf16 / fp32.
`_engram_lookup_kernel`, grid (cdiv(T * R, BLOCK_ROWS),): BLOCK_ROWS table rows per program, their
code bytes as 16-byte vectors, their scale bytes as int32 words (head_dim a multiple of 128; byte
loads below that, test models only); e4m3 decoded
with integer bit operations and an exact power-of-two multiply (kv_pack_triton._e4m3_scaled).
"""

import torch
import triton
import triton.language as tl

from v4serve.ops.kv_pack_triton import _e4m3_scaled

LOOKUP_CONFIG = dict(BLOCK_ROWS=4, num_warps=2)  # 4 rows of 256 codes: 16 bytes per thread at 2 warps


@triton.jit
def _engram_lookup_kernel(codes_ptr, scales_ptr, rows_ptr, out_ptr, n_rows, head_dim, stride_codes, stride_scales,
                          stride_out, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, SCALE_BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    ok = i < n_rows
    row = tl.load(rows_ptr + i, mask=ok, other=0)
    ch = tl.arange(0, BLOCK_D)
    ch_ok = ch < head_dim
    G: tl.constexpr = BLOCK_D // SCALE_BLOCK
    codes = tl.load(codes_ptr + row[:, None] * stride_codes + ch[None, :], mask=ok[:, None] & ch_ok[None, :], other=0)
    if G % 4 == 0:  # the scale row as int32 words (4 scales a word; row stride a multiple of 4 bytes)
        m = tl.arange(0, G // 4)
        words = tl.load(scales_ptr.to(tl.pointer_type(tl.int32)) + row[:, None] * (stride_scales // 4) + m[None, :],
                        mask=ok[:, None] & (m * 4 * SCALE_BLOCK < head_dim)[None, :], other=0x7F7F7F7F)
        scale_bytes = tl.reshape((words[:, :, None] >> (8 * tl.arange(0, 4))[None, None, :]) & 0xFF, (BLOCK_ROWS, G))
    else:  # fewer than 4 scales a row (head_dim < 128: test models)
        g = tl.arange(0, G)
        scale_bytes = tl.load(scales_ptr + row[:, None] * stride_scales + g[None, :],
                              mask=ok[:, None] & (g * SCALE_BLOCK < head_dim)[None, :], other=127)
    values = _e4m3_scaled(tl.reshape(codes, (BLOCK_ROWS, G, SCALE_BLOCK)), scale_bytes.to(tl.int32)[:, :, None])
    values = tl.reshape(values, (BLOCK_ROWS, BLOCK_D))
    tl.store(out_ptr + i.to(tl.int64)[:, None] * stride_out + ch[None, :], values.to(out_ptr.dtype.element_ty),
             mask=ok[:, None] & ch_ok[None, :])


def engram_lookup_triton(table: torch.Tensor, table_scale: torch.Tensor, rows: torch.Tensor, dtype: torch.dtype,
                         scale_block: int, config: dict | None = None) -> torch.Tensor:
    cfg = {**LOOKUP_CONFIG, **(config or {})}
    n, head_dim = table.shape
    codes = table.view(torch.uint8)
    if codes.stride(1) != 1 or table_scale.stride(1) != 1 or codes.data_ptr() % 16 or codes.stride(0) % 16:
        raise ValueError("the Engram table must have contiguous, 16-byte aligned rows")
    if (head_dim // scale_block) % 4 == 0 and (table_scale.data_ptr() % 4 or table_scale.stride(0) % 4):
        raise ValueError("the Engram scale rows are read as int32 words: they must be 4-byte aligned")
    flat = rows.reshape(-1)
    out = torch.empty(flat.shape[0], head_dim, dtype=dtype, device=rows.device)
    if flat.shape[0]:
        block_rows = cfg.pop("BLOCK_ROWS")
        _engram_lookup_kernel[(triton.cdiv(flat.shape[0], block_rows),)](
            codes, table_scale, flat.contiguous(), out, flat.shape[0], head_dim, codes.stride(0), table_scale.stride(0),
            out.stride(0), BLOCK_ROWS=block_rows, BLOCK_D=max(scale_block, triton.next_power_of_2(head_dim)),
            SCALE_BLOCK=scale_block, **cfg)
    return out.view(rows.shape[0], rows.shape[1] * head_dim)
