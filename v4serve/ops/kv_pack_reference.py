"""Torch reference of packing KV rows into their byte layout (v4serve/formats.py) and back.

pack: per block of `block` quantized channels, the scale s of kv_quant_reference.py (ue8m0: the
power of two 2^ceil(log2(max(amax, floor) / qmax)); e4m3: e4m3_rne(max(amax, floor) / qmax)),
then the code of round(clamp(x / s, -qmax, qmax)) (RNE):

    e4m3 code   the float8_e4m3fn byte of the rounded value
    e2m1 code   sign << 3 | i, where i indexes the grid (0, .5, 1, 1.5, 2, 3, 4, 6); element 2j
                in the low nibble of byte j, 2j + 1 in the high nibble
    ue8m0 byte  the biased fp32 exponent of s (s = 2^(byte - 127); never 0 or 255 here)
    tail        the plain_tail channels rounded to bf16, little-endian bytes

unpack: value = decode(code) * s in fp32 (exact: at most 4 significant bits times a power of two
or an e4m3 value), rounded to `dtype`; the tail is read as bf16. So for bf16 rows
unpack_rows(pack_rows(x)) == apply_kv_format(x) bit for bit, signed zeros included; for fp32
rows the quantized channels match bit for bit and the tail is x's tail rounded to bf16.
"""

import torch

from v4serve.formats import RowFormat
from v4serve.ops.kv_quant_reference import (
    E2M1_MAX,
    E4M3_MAX,
    FP4_E4M3_SCALE_FLOOR,
    FP4_UE8M0_SCALE_FLOOR,
    FP8_SCALE_FLOOR,
    round_e2m1,
    round_e4m3,
    ue8m0_scale,
)

E2M1_GRID = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def _qmax_floor(fmt: RowFormat) -> tuple[float, float]:
    if fmt.value_bits == 8:
        return E4M3_MAX, FP8_SCALE_FLOOR
    return E2M1_MAX, FP4_UE8M0_SCALE_FLOOR if fmt.scale_kind == "ue8m0" else FP4_E4M3_SCALE_FLOOR


def block_scales(head: torch.Tensor, fmt: RowFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """head [N, G, block] fp32 -> (scale [N, G, 1] fp32, scale bytes [N, G] uint8)."""
    qmax, floor = _qmax_floor(fmt)
    amax = head.abs().amax(-1, keepdim=True)
    if fmt.scale_kind == "ue8m0":
        s = ue8m0_scale(amax, qmax, floor)
        return s, ((s.view(torch.int32) >> 23) & 0xFF).to(torch.uint8).squeeze(-1)
    s = round_e4m3(amax.clamp(min=floor) / qmax)
    return s, s.to(torch.float8_e4m3fn).view(torch.uint8).squeeze(-1)


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """Values already on the e2m1 grid (signed) -> their 4-bit codes (uint8)."""
    a = y.abs()
    idx = torch.zeros_like(a, dtype=torch.uint8)
    for i, g in enumerate(E2M1_GRID[1:], 1):
        idx = torch.where(a == g, i, idx).to(torch.uint8)
    return idx | (torch.signbit(y).to(torch.uint8) << 3)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """4-bit e2m1 codes (uint8) -> fp32 values, signed zeros kept. The grid is selected with
    scalar `where`s, not gathered from a tensor built from the host list: that would be a pageable
    host-to-device copy, which a CUDA-graph capture of the decode step does not allow."""
    i = codes & 7
    mag = torch.zeros(codes.shape, dtype=torch.float32, device=codes.device)
    for code, g in enumerate(E2M1_GRID[1:], 1):
        mag = torch.where(i == code, g, mag)
    return torch.where((codes & 8) != 0, -mag, mag)


def pack_rows_reference(x: torch.Tensor, fmt: RowFormat) -> torch.Tensor:
    """x [N, dim] -> uint8 [N, fmt.row_bytes(dim)]."""
    n, dim = x.shape
    q = fmt.n_quant(dim)
    out = torch.zeros(n, fmt.row_bytes(dim), dtype=torch.uint8, device=x.device)
    if n == 0:
        return out
    qmax, _ = _qmax_floor(fmt)
    head = x[:, :q].float().reshape(n, q // fmt.block, fmt.block)
    s, scale_bytes = block_scales(head, fmt)
    y = (head / s).clamp(-qmax, qmax)
    if fmt.value_bits == 8:
        codes = y.to(torch.float8_e4m3fn).view(torch.uint8).reshape(n, q)
    else:
        nib = e2m1_codes(round_e2m1(y)).reshape(n, q // 2, 2)
        codes = nib[..., 0] | (nib[..., 1] << 4)
    out[:, : fmt.codes_bytes(dim)] = codes
    if fmt.plain_tail:
        tail = x[:, q:].to(torch.bfloat16).contiguous().view(torch.uint8)
        out[:, fmt.tail_offset(dim) : fmt.tail_offset(dim) + fmt.tail_bytes(dim)] = tail
    off = fmt.scales_offset(dim)
    out[:, off : off + fmt.n_scales(dim)] = scale_bytes
    return out


def unpack_rows_reference(packed: torch.Tensor, fmt: RowFormat, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """uint8 [N, >= fmt.row_bytes(dim)] -> [N, dim] `dtype`."""
    n = packed.shape[0]
    q = fmt.n_quant(dim)
    codes = packed[:, : fmt.codes_bytes(dim)]
    if fmt.value_bits == 8:
        v = codes.contiguous().view(torch.float8_e4m3fn).float()
    else:
        v = torch.stack([e2m1_values(codes & 0xF), e2m1_values(codes >> 4)], -1).reshape(n, q)
    off = fmt.scales_offset(dim)
    sb = packed[:, off : off + fmt.n_scales(dim)]
    if fmt.scale_kind == "ue8m0":
        s = (sb.to(torch.int32) << 23).view(torch.float32)
    else:
        s = sb.contiguous().view(torch.float8_e4m3fn).float()
    v = (v.reshape(n, -1, fmt.block) * s[..., None]).reshape(n, q).to(dtype)
    if not fmt.plain_tail:
        return v
    t0 = fmt.tail_offset(dim)
    tail = packed[:, t0 : t0 + fmt.tail_bytes(dim)].contiguous().view(torch.bfloat16).to(dtype)
    return torch.cat([v, tail], 1)


def store_rows_reference(pool: torch.Tensor, rows: torch.Tensor, x: torch.Tensor, fmt: RowFormat) -> None:
    """pool[rows[i]] = pack(x[i]) in place, for every rows[i] >= 0 (negative rows are skipped).

    Without a host sync, so that the decode step that calls it can be captured in a CUDA graph
    (selecting the kept rows with a boolean mask would run `nonzero`, whose size the host must
    read): every row is packed, and a negative row i writes instead what the first kept row f
    writes (pool[rows[f]] = pack(x[f]): the same bytes to the same place, so duplicates cannot
    race); when no row is kept, each writes pool[0] back onto itself."""
    keep = rows >= 0
    i = torch.arange(rows.shape[0], device=rows.device)
    first = torch.argmax(keep.to(torch.int32)) if rows.shape[0] else i.sum()  # 0 when none is kept
    src = torch.where(keep, i, first)
    dst = rows.to(torch.int64)[src].clamp(min=0)
    packed = pack_rows_reference(x, fmt)
    width = packed.shape[1]
    pool[dst, :width] = torch.where(keep[src, None], packed[src], pool[dst, :width])
