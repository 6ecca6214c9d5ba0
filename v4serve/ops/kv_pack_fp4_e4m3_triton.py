"""Triton device functions and the unpack kernel of fp4_e4m3_b16 rows (DeepSeek-V4.1's compressed
KV; byte layout in v4serve/formats.py, math in kv_pack_reference.py), and `load_row_values`, which
decodes a tile of rows of either packed family: the ue8m0 fp8 rows of kv_pack_triton.py or these.

An fp4_e4m3_b16 row of D channels: bytes [0, D / 2) hold the e2m1 codes, two per byte (channel 2i
in the low nibble, 2i + 1 in the high one; bit 3 = sign), bytes [D / 2, D / 2 + D / 16) one e4m3
scale byte per block of 16 channels; the row is padded to 16 bytes (288 B at D = 512). A value is

    e2m1(code) * e4m3(scale)            exact in fp32 and in bf16 (2 + 4 significant bits)

decoded with integer bit operations (no table): the e2m1 magnitude index i = code & 7 becomes the
fp32 with bits (i + 252) << 22 for i >= 2 (exponent i >> 1, mantissa bit i & 1: 1, 1.5, 2, 3, 4,
6), 0.5 for i = 1 and 0 for i = 0, the sign bit moved from bit 3 to bit 31; the e4m3 scale byte as
in kv_pack_triton (the fp16 with bits (c & 0x80) << 8 | (c & 0x7f) << 7, times 2^8). `load_fp4_e4m3`
reads a [R, K] tile (K = the padded row width, channels >= D zero) as int32 words: each row's codes
as K / 8 words (8 channels a word; 16-byte loads at 16-byte aligned rows) and its scale bytes as
K / 64 words (4 blocks a word, the scales start 16-byte aligned: at D = 512 two 16-byte loads);
nibbles and bytes are taken out of the words with shifts.

Pack (`pack_fp4_e4m3_row`, one row in registers as fp32), per block of 16 channels, exactly as
kv_pack_reference.py: s = e4m3(max(amax, 6 * 2^-9) / 6) (IEEE division, then rounded to the e4m3
grid, ties to even), y = e2m1(clamp(x / s, -6, 6)) (IEEE division; the e2m1 grid, ties to even),
the codes and the scale byte from the rounded values' bits (kv_pack_triton's _e2m1_code /
_e4m3_code), padding zero. (A block with amax / 6 above e4m3's 448 has no e4m3 scale; the
reference then stores NaN, this kernel the next grid value: never met by normalised KV rows.)

`_unpack_fp4_e4m3_rows_kernel`, grid (cdiv(N, UNPACK_ROWS),): 16 rows per program;
`_store_fp4_e4m3_rows_kernel`, grid (N,): one row per program (skipped when rows[i] < 0).
"""

import torch
import triton
import triton.language as tl

from v4serve.ops.kv_pack_triton import _e2m1_code, _e4m3_code, _e4m3_scaled, load_packed, packed_constexprs
from v4serve.ops.kv_quant_triton import _round_to_grid

E2M1_MAX = tl.constexpr(6.0)
SCALE_FLOOR = tl.constexpr(6.0 * 2.0**-9)  # kv_quant_reference.FP4_E4M3_SCALE_FLOOR: the smallest scale, e4m3's 2^-9

UNPACK_ROWS = 16


@triton.jit
def _e2m1_values(code):
    """4-bit e2m1 codes (int32, 0..15) -> their fp32 values, signed zeros kept."""
    i = code & 7
    mag = tl.where(i >= 2, (i + 252) << 22, tl.where(i == 1, 126 << 23, 0))
    return (mag | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def load_fp4_e4m3(row_ptrs, live, K: tl.constexpr, FP4_NQ: tl.constexpr, FP4_BLOCK: tl.constexpr,
                  FP4_SCALE_OFF: tl.constexpr, OUT_DTYPE: tl.constexpr = tl.bfloat16):
    """Channels [0, K) of the fp4_e4m3_b16 rows of FP4_NQ channels at row_ptrs (uint8* [R], 16-byte
    aligned; rows not `live` and channels >= FP4_NQ read as 0) as OUT_DTYPE [R, K]. The row width is
    a constexpr so that the word masks are constant along a row (16-byte vector loads)."""
    R: tl.constexpr = row_ptrs.shape[0]
    G: tl.constexpr = K // FP4_BLOCK
    words = tl.multiple_of(tl.multiple_of(row_ptrs, 16).to(tl.pointer_type(tl.int32)), 16)
    # codes: word k holds channels 8k .. 8k + 7, channel 8k + j in bits [4j, 4j + 4) (little-endian bytes)
    k = tl.arange(0, K // 8)
    code_words = tl.load(words[:, None] + k[None, :], mask=live[:, None] & (k < FP4_NQ // 8)[None, :], other=0)
    nibbles = (code_words[:, :, None] >> (4 * tl.arange(0, 8))[None, None, :]) & 0xF  # [R, K / 8, 8]
    # scales: word m holds the scale bytes of blocks 4m .. 4m + 3, block 4m + j in bits [8j, 8j + 8)
    m = tl.arange(0, G // 4)
    scale_words = tl.load(words[:, None] + FP4_SCALE_OFF // 4 + m[None, :],
                          mask=live[:, None] & (m * (4 * FP4_BLOCK) < FP4_NQ)[None, :], other=0)
    scale_bytes = (scale_words[:, :, None] >> (8 * tl.arange(0, 4))[None, None, :]) & 0xFF  # [R, G / 4, 4]
    scales = _e4m3_scaled(tl.reshape(scale_bytes, (R, G)), tl.full((R, G), 127, tl.int32))  # the e4m3 values
    v = tl.reshape(_e2m1_values(nibbles), (R, G, FP4_BLOCK)) * scales[:, :, None]
    return tl.reshape(v.to(OUT_DTYPE), (R, K))


@triton.jit
def load_row_values(row_ptrs, live, D, K: tl.constexpr, FP4_E4M3: tl.constexpr, PK_NQ: tl.constexpr,
                    PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr,
                    PK_HAS_TAIL: tl.constexpr, OUT_DTYPE: tl.constexpr = tl.bfloat16, FP8_CVT: tl.constexpr = False):
    """Whole rows (channels [0, K)) of either packed family, by the constexprs of `row_constexprs`."""
    if FP4_E4M3:
        return load_fp4_e4m3(row_ptrs, live, K, PK_NQ, PK_BLOCK, PK_SCALE_OFF, OUT_DTYPE)
    else:
        return load_packed(row_ptrs, live, 0, D, K, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                           OUT_DTYPE, FP8_CVT)


def row_constexprs(fmt, dim: int) -> dict:
    """The constexprs of `load_row_values` for rows of `fmt` (ue8m0 fp8 or fp4_e4m3_b16) of `dim`."""
    if fmt.name == "fp4_e4m3_b16":
        if fmt.scales_offset(dim) % 16:
            raise ValueError(f"{fmt.name} rows of {dim} channels: the scale bytes must start 16-byte aligned")
        return dict(FP4_E4M3=True, PK_NQ=fmt.n_quant(dim), PK_BLOCK=fmt.block, PK_TAIL_OFF=0,
                    PK_SCALE_OFF=fmt.scales_offset(dim), PK_HAS_TAIL=False)
    if fmt.value_bits != 8:
        raise ValueError(f"no Triton row decoder for {fmt.name}")
    pk = packed_constexprs(fmt, dim)
    return dict(FP4_E4M3=False, **{k: pk[k] for k in ("PK_NQ", "PK_BLOCK", "PK_TAIL_OFF", "PK_SCALE_OFF",
                                                       "PK_HAS_TAIL")})


def row_block_d(fmt, dim: int) -> int:
    """The padded tile width K of `load_row_values` for rows of `dim` channels (fp4_e4m3_b16: at least
    4 scale blocks, one int32 word of scales)."""
    return max(triton.next_power_of_2(dim), fmt.block * (4 if fmt.name == "fp4_e4m3_b16" else 1), 16)


@triton.jit
def _unpack_fp4_e4m3_rows_kernel(packed_ptr, out_ptr, N, D, stride_p, stride_o, BLOCK_R: tl.constexpr,
                                 BLOCK_D: tl.constexpr, FP4_NQ: tl.constexpr, FP4_BLOCK: tl.constexpr,
                                 FP4_SCALE_OFF: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = r < N
    v = load_fp4_e4m3(packed_ptr + r.to(tl.int64) * stride_p, ok, BLOCK_D, FP4_NQ, FP4_BLOCK, FP4_SCALE_OFF,
                      out_ptr.dtype.element_ty)
    ch = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * stride_o + ch[None, :], v, mask=ok[:, None] & (ch < D)[None, :])


def unpack_fp4_e4m3_rows_triton(packed: torch.Tensor, fmt, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """uint8 [N, >= row_bytes] fp4_e4m3_b16 rows (16-byte aligned) -> [N, dim] `dtype`."""
    n = packed.shape[0]
    out = torch.empty(n, dim, dtype=dtype, device=packed.device)
    if n == 0:
        return out
    if packed.data_ptr() % 16 or packed.stride(0) % 16 or packed.stride(1) != 1:
        raise ValueError("fp4_e4m3_b16 rows must be 16-byte aligned with contiguous bytes")
    c = row_constexprs(fmt, dim)
    _unpack_fp4_e4m3_rows_kernel[(triton.cdiv(n, UNPACK_ROWS),)](
        packed, out, n, dim, packed.stride(0), out.stride(0), BLOCK_R=UNPACK_ROWS, BLOCK_D=row_block_d(fmt, dim),
        FP4_NQ=c["PK_NQ"], FP4_BLOCK=c["PK_BLOCK"], FP4_SCALE_OFF=c["PK_SCALE_OFF"], num_warps=4)
    return out


@triton.jit
def pack_fp4_e4m3_row(dst, y, BLOCK_D: tl.constexpr, FP4_NQ: tl.constexpr, FP4_BLOCK: tl.constexpr,
                      FP4_SCALE_OFF: tl.constexpr, FP4_ROW_BYTES: tl.constexpr):
    """Quantize and pack one row y (fp32 [BLOCK_D], channels >= FP4_NQ ignored) to the bytes at dst."""
    G: tl.constexpr = BLOCK_D // FP4_BLOCK
    g = tl.arange(0, G)
    ch = g[:, None] * FP4_BLOCK + tl.arange(0, FP4_BLOCK)[None, :]
    yb = tl.where(ch < FP4_NQ, tl.reshape(y, (G, FP4_BLOCK)), 0.0)
    ratio = tl.math.div_rn(tl.maximum(tl.max(tl.abs(yb), 1), SCALE_FLOOR), E2M1_MAX)
    scale = _round_to_grid(ratio, 3, -6)  # the e4m3 grid (subnormals included), ties to even
    v = tl.minimum(tl.maximum(tl.math.div_rn(yb, scale[:, None]), -E2M1_MAX), E2M1_MAX)
    code = _e2m1_code(_round_to_grid(v, 1, 0))
    lo, hi = tl.split(tl.reshape(code, (G, FP4_BLOCK // 2, 2)))
    pairs = g[:, None] * (FP4_BLOCK // 2) + tl.arange(0, FP4_BLOCK // 2)[None, :]
    tl.store(dst + pairs, (lo | (hi << 4)).to(tl.uint8), mask=pairs < FP4_NQ // 2)
    tl.store(dst + FP4_SCALE_OFF + g, _e4m3_code(scale).to(tl.uint8), mask=g < FP4_NQ // FP4_BLOCK)
    PAD: tl.constexpr = 16
    pad = FP4_SCALE_OFF + FP4_NQ // FP4_BLOCK + tl.arange(0, PAD)
    tl.store(dst + pad, tl.zeros([PAD], tl.uint8), mask=pad < FP4_ROW_BYTES)


@triton.jit
def _store_fp4_e4m3_rows_kernel(x_ptr, rows_ptr, pool_ptr, D, stride_x, stride_pool, HAS_ROWS: tl.constexpr,
                                BLOCK_D: tl.constexpr, FP4_NQ: tl.constexpr, FP4_BLOCK: tl.constexpr,
                                FP4_SCALE_OFF: tl.constexpr, FP4_ROW_BYTES: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    row = i
    if HAS_ROWS:
        row = tl.load(rows_ptr + i).to(tl.int64)
    if row >= 0:
        ch = tl.arange(0, BLOCK_D)
        y = tl.load(x_ptr + i * stride_x + ch, mask=ch < D, other=0.0).to(tl.float32)
        pack_fp4_e4m3_row(pool_ptr + row * stride_pool, y, BLOCK_D, FP4_NQ, FP4_BLOCK, FP4_SCALE_OFF, FP4_ROW_BYTES)


def store_fp4_e4m3_rows_triton(pool: torch.Tensor, rows: torch.Tensor | None, x: torch.Tensor, fmt) -> None:
    """pool[rows[i]] = pack(x[i]) for fp4_e4m3_b16 (rows None: pool[i]); rows[i] < 0 skipped."""
    n, D = x.shape
    if n == 0:
        return
    if x.stride(1) != 1:
        x = x.contiguous()
    c = row_constexprs(fmt, D)
    _store_fp4_e4m3_rows_kernel[(n,)](
        x, x if rows is None else rows.contiguous(), pool, D, x.stride(0), pool.stride(0), HAS_ROWS=rows is not None,
        BLOCK_D=row_block_d(fmt, D), FP4_NQ=c["PK_NQ"], FP4_BLOCK=c["PK_BLOCK"], FP4_SCALE_OFF=c["PK_SCALE_OFF"],
        FP4_ROW_BYTES=fmt.row_bytes(D), num_warps=max(1, min(4, triton.next_power_of_2(D) // 256)))
