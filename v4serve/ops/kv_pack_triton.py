"""Triton kernels and device functions of packed KV rows (byte layouts: v4serve/formats.py; math:
kv_pack_reference.py). The ue8m0 formats only (fp4_e4m3_b16 is torch only).

Pack (`pack_row`, one row held in registers as fp32 [BLOCK_D], the channels >= D zero): per group
of PK_BLOCK quantized channels, e = ceil(log2(max(amax, FLOOR) / QMAX)) from the fp32 bits, the
scaled value y = clamp(x * 2^-e) rounded to the grid on its fp32 bits (kv_quant_triton's
`_round_to_grid`, exact in the interpreter too), then the code from the rounded value's bits:

    e4m3  |y| >= 2^-6: (bits >> 20) - (120 << 3)   (exponent rebiased 127 -> 7, top 3 mantissa bits)
          |y| <  2^-6: |y| * 2^9                    (subnormal: an integer 0..7)
          | sign << 7
    e2m1  |y| >= 1: (bits >> 22) - 252; |y| = 0.5: 1; 0: 0;  | sign << 3; pairs packed low nibble first
    ue8m0 e + 127;  tail: the channels >= N_QUANT rounded to bf16;  padding: zero

Dequantize (`load_packed`, a [R, K] tile of channels [d0, d0 + K) of R rows): the e4m3 byte c
becomes the fp16 with bits (c & 0x80) << 8 | (c & 0x7f) << 7, which is decode(c) * 2^-8 exactly
(subnormals included: both formats put the implicit bit at exponent field 0), converted to fp32,
times 2^8 (now decode(c), a normal fp32 or 0) and times 2^(b - 127); every step is exact, as is
the final cast to bf16 (at most 4 significant bits; done per element before the tile is
reshaped, so no fp32 copy of a whole tile is live). On sm_89+ (FP8_CVT) the hardware e4m3 ->
fp32 conversion replaces the integer construction, with the same values (one F2FP per two codes:
~3 SASS instructions per code against ~10 on sm_90, codegen of Triton 3.6); a bf16 tile then
takes the scale as one bf16x2 multiply per two codes after the cast (exact too:
`_e4m3_scaled_cvt_bf16`; ~2.5 instructions per code). The tile is loaded
as [R, G, SUB] with SUB = min(K, PK_BLOCK) contiguous bytes per (row, group), so each group is one
or more 16-byte loads at 16-byte aligned row strides; the scale bytes are read as the int32 words
that hold them (4-byte loads).

Grids: `_store_rows_kernel` (N,): one program per row (skipped when rows[i] < 0);
`_unpack_rows_kernel` (cdiv(N, 16),): 16 rows per program.
"""

import torch
import triton
import triton.language as tl

from v4serve.ops.kv_quant_triton import _pow2, _round_to_grid


def packed_constexprs(fmt, dim: int) -> dict:
    """The PK_* constexprs the packed-row device functions take, for rows of `dim` channels."""
    if fmt.scale_kind != "ue8m0":
        raise ValueError(f"row format {fmt.name} has no Triton kernel (torch only)")
    if fmt.scales_offset(dim) % 4 or fmt.scales_offset(dim) + -(-fmt.n_scales(dim) // 4) * 4 > fmt.row_bytes(dim):
        raise ValueError(f"{fmt.name} rows of {dim} channels: the scale words must be 4-byte aligned inside the row")
    return dict(PK_FP4=fmt.value_bits == 4, PK_NQ=fmt.n_quant(dim), PK_BLOCK=fmt.block,
                PK_TAIL_OFF=fmt.tail_offset(dim), PK_SCALE_OFF=fmt.scales_offset(dim),
                PK_HAS_TAIL=fmt.plain_tail > 0, PK_PAYLOAD=fmt.payload_bytes(dim), PK_ROW_BYTES=fmt.row_bytes(dim))


@triton.jit
def _e4m3_code(y):
    bits = y.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    normal = (mag >> 20) - (120 << 3)
    sub = (mag.to(tl.float32, bitcast=True) * 512.0).to(tl.int32)
    return tl.where(mag >= (121 << 23), normal, sub) | ((bits >> 24) & 0x80)


@triton.jit
def _e2m1_code(y):
    bits = y.to(tl.int32, bitcast=True)
    mag = bits & 0x7FFFFFFF
    idx = tl.where(mag >= (127 << 23), (mag >> 22) - 252, (mag != 0).to(tl.int32))
    return idx | ((bits >> 28) & 0x8)


@triton.jit
def pack_row(dst, y, D, BLOCK_D: tl.constexpr, PK_FP4: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr,
             PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr,
             PK_PAYLOAD: tl.constexpr, PK_ROW_BYTES: tl.constexpr):
    """Quantize and pack one row y (fp32 [BLOCK_D], channels >= D ignored) to the bytes at dst (uint8*)."""
    G: tl.constexpr = BLOCK_D // PK_BLOCK
    g = tl.arange(0, G)
    ch = g[:, None] * PK_BLOCK + tl.arange(0, PK_BLOCK)[None, :]
    is_q = ch < PK_NQ
    yb = tl.reshape(y, (G, PK_BLOCK))
    if PK_FP4:
        QMAX: tl.constexpr = 6.0
        FLOOR: tl.constexpr = 6.0 * 2.0**-126
    else:
        QMAX: tl.constexpr = 448.0
        FLOOR: tl.constexpr = 1e-4
    amax = tl.max(tl.where(is_q, tl.abs(yb), 0.0), 1)
    ratio_bits = tl.math.div_rn(tl.maximum(amax, FLOOR), QMAX).to(tl.int32, bitcast=True)
    e = ((ratio_bits >> 23) & 0xFF) - 127 + ((ratio_bits & 0x7FFFFF) != 0).to(tl.int32)
    v = tl.minimum(tl.maximum(yb * _pow2(-e)[:, None], -QMAX), QMAX)
    if PK_FP4:
        code = _e2m1_code(_round_to_grid(v, 1, 0))
        lo, hi = tl.split(tl.reshape(code, (G, PK_BLOCK // 2, 2)))
        pairs = g[:, None] * (PK_BLOCK // 2) + tl.arange(0, PK_BLOCK // 2)[None, :]
        tl.store(dst + pairs, (lo | (hi << 4)).to(tl.uint8), mask=pairs < PK_NQ // 2)
    else:
        code = _e4m3_code(_round_to_grid(v, 3, -6))
        tl.store(dst + ch, code.to(tl.uint8), mask=is_q)
    if PK_HAS_TAIL:
        tail_ptr = (dst + PK_TAIL_OFF).to(tl.pointer_type(tl.bfloat16))
        tl.store(tail_ptr + (ch - PK_NQ), yb.to(tl.bfloat16), mask=(ch >= PK_NQ) & (ch < D))
    tl.store(dst + PK_SCALE_OFF + g, (e + 127).to(tl.uint8), mask=g < PK_NQ // PK_BLOCK)
    PAD: tl.constexpr = 16
    pad = PK_PAYLOAD + tl.arange(0, PAD)
    tl.store(dst + pad, tl.zeros([PAD], tl.uint8), mask=pad < PK_ROW_BYTES)


@triton.jit
def _e4m3_scaled(codes, scale_bytes):
    """e4m3 bytes (uint8) times 2^(b - 127) for ue8m0 bytes b (int32, broadcastable), in fp32."""
    c = codes.to(tl.int16)
    h = ((c & 0x80) << 8) | ((c & 0x7F) << 7)
    return (h.to(tl.float16, bitcast=True).to(tl.float32) * 256.0) * _pow2(scale_bytes - 127)


@triton.jit
def _e4m3_scaled_cvt(codes, scale_bytes):
    """_e4m3_scaled through the hardware fp8 conversion (sm_89+: one F2FP per two codes instead of
    the integer fp16 construction): decode(c) exactly in fp32, times 2^(b - 127)."""
    return codes.to(tl.float8e4nv, bitcast=True).to(tl.float32) * _pow2(scale_bytes - 127)


@triton.jit
def _e4m3_scaled_cvt_bf16(codes, scale_bytes):
    """_e4m3_scaled_cvt with a bf16 result and the scale multiply in bf16: decode(c) is exact in bf16
    (at most 4 significant bits), 2^(b - 127) is the bf16 with bits b << 7, and their bf16 product
    is exact wherever the fp32 one is (bf16 has fp32's exponent range), so the values are those of
    _e4m3_scaled_cvt(...).to(bf16). One bf16x2 multiply per two codes (HMUL2.BF16 on sm_90)
    instead of two fp32 multiplies; the conversion goes through fp32 (HADD2.F32, then one F2FP pack
    per two values: Triton's direct e4m3 -> bf16 conversion takes one F2F per value, a
    quarter-rate unit's instruction)."""
    scale = (scale_bytes << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return codes.to(tl.float8e4nv, bitcast=True).to(tl.float32).to(tl.bfloat16) * scale


@triton.jit
def load_packed(row_ptrs, live, d0, D, K: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr,
                PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr,
                OUT_DTYPE: tl.constexpr = tl.bfloat16, FP8_CVT: tl.constexpr = False):
    """Channels [d0, d0 + K) of the fp8 rows at row_ptrs (uint8* [R]; rows not `live` and channels
    >= D read as 0) as OUT_DTYPE [R, K] (bf16 or fp32). d0 is a multiple of min(K, PK_BLOCK).
    FP8_CVT: decode the codes with the hardware e4m3 conversion (sm_89+; the same values).
    load_packed_bytes then dequantize_packed: a loop can issue the next tile's loads first."""
    codes, words, tail = load_packed_bytes(row_ptrs, live, d0, D, K, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF,
                                           PK_HAS_TAIL)
    return dequantize_packed(codes, words, tail, d0, D, K, PK_NQ, PK_BLOCK, PK_HAS_TAIL, OUT_DTYPE, FP8_CVT)


@triton.jit
def load_packed_bytes(row_ptrs, live, d0, D, K: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr,
                      PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr):
    """load_packed's loads: (codes uint8 [R, G, SUB], the int32 words holding each group's scale byte
    [R, G], the bf16 tail: [R, G, SUB] when G == 1, else [R, SUB] broadcast over the groups later;
    without a tail, the codes again, unused). G groups of SUB = K / G channels, SUB = min(K, PK_BLOCK):
    each (row, group) is one or more 16-byte loads at 16-byte aligned row strides; the scale bytes
    come from the aligned int32 word holding them (PK_SCALE_OFF is a multiple of 4 and the row pads
    the last word), so no load is narrower than 4 bytes. A tile of several groups loads the bf16
    tail once as [R, SUB] (as a masked [R, G, SUB] tensor it would cost a whole bf16 tile of
    registers and pipeline buffers)."""
    G: tl.constexpr = (K + PK_BLOCK - 1) // PK_BLOCK
    SUB: tl.constexpr = K // G
    TAIL: tl.constexpr = (PK_SCALE_OFF - PK_TAIL_OFF) // 2  # bf16 tail channels: [PK_NQ, PK_NQ + TAIL)
    # No group straddles the codes and the tail; a tile of several groups holds the whole tail in
    # the one group that starts at PK_NQ (d0 is a multiple of PK_BLOCK then).
    tl.static_assert(not PK_HAS_TAIL or (PK_NQ % SUB == 0 and (G == 1 or TAIL <= SUB)))
    g = tl.arange(0, G)
    ch = d0 + g[:, None] * SUB + tl.arange(0, SUB)[None, :]  # [G, SUB]
    base = tl.multiple_of(row_ptrs, 16)[:, None, None]
    codes = tl.load(base + ch[None, :, :], mask=live[:, None, None] & (ch < PK_NQ)[None, :, :], other=0)
    group = (d0 + g * SUB) // PK_BLOCK
    words = (row_ptrs + PK_SCALE_OFF).to(tl.pointer_type(tl.int32))
    sw = tl.load(words[:, None] + (group // 4)[None, :], mask=live[:, None], other=0x7F7F7F7F)
    tail = codes
    if PK_HAS_TAIL:
        if G == 1:
            in_tail = (ch >= PK_NQ) & (ch < D)
            tail_ptr = (base + PK_TAIL_OFF).to(tl.pointer_type(tl.bfloat16))
            tail = tl.load(tail_ptr + (ch - PK_NQ)[None, :, :], mask=live[:, None, None] & in_tail[None, :, :],
                           other=0.0)
        else:
            lane = tl.arange(0, SUB)
            lane_ok = (lane < TAIL) & (PK_NQ + lane < D) & (d0 + K > PK_NQ)
            tail_ptr = (tl.multiple_of(row_ptrs, 16) + PK_TAIL_OFF).to(tl.pointer_type(tl.bfloat16))
            tail = tl.load(tail_ptr[:, None] + lane[None, :], mask=live[:, None] & lane_ok[None, :], other=0.0)
    return codes, sw, tail


@triton.jit
def dequantize_packed(codes, sw, tail, d0, D, K: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr,
                      PK_HAS_TAIL: tl.constexpr, OUT_DTYPE: tl.constexpr = tl.bfloat16,
                      FP8_CVT: tl.constexpr = False):
    """The [R, K] OUT_DTYPE tile of load_packed_bytes' (codes, sw, tail). The values are cast to
    OUT_DTYPE per element, before the [R, G, SUB] -> [R, K] reshape."""
    G: tl.constexpr = (K + PK_BLOCK - 1) // PK_BLOCK
    SUB: tl.constexpr = K // G
    g = tl.arange(0, G)
    ch = d0 + g[:, None] * SUB + tl.arange(0, SUB)[None, :]  # [G, SUB]
    group = (d0 + g * SUB) // PK_BLOCK
    sb = (sw >> (8 * (group % 4))[None, :]) & 0xFF
    if FP8_CVT and OUT_DTYPE == tl.bfloat16:
        v = _e4m3_scaled_cvt_bf16(codes, sb[:, :, None])
    elif FP8_CVT:
        v = _e4m3_scaled_cvt(codes, sb[:, :, None]).to(OUT_DTYPE)
    else:
        v = _e4m3_scaled(codes, sb[:, :, None]).to(OUT_DTYPE)
    if PK_HAS_TAIL:
        in_tail = (ch >= PK_NQ) & (ch < D)
        if G == 1:
            v = tl.where(in_tail[None, :, :], tail.to(OUT_DTYPE), v)
        else:
            v = tl.where(in_tail[None, :, :], tail.to(OUT_DTYPE)[:, None, :], v)
    return tl.reshape(v, (codes.shape[0], K))


@triton.jit
def _store_rows_kernel(x_ptr, rows_ptr, pool_ptr, D, stride_x, stride_pool, HAS_ROWS: tl.constexpr,
                       BLOCK_D: tl.constexpr, PK_FP4: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr,
                       PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr,
                       PK_PAYLOAD: tl.constexpr, PK_ROW_BYTES: tl.constexpr):
    i = tl.program_id(0).to(tl.int64)
    row = i
    if HAS_ROWS:
        row = tl.load(rows_ptr + i).to(tl.int64)
    if row >= 0:
        ch = tl.arange(0, BLOCK_D)
        y = tl.load(x_ptr + i * stride_x + ch, mask=ch < D, other=0.0).to(tl.float32)
        pack_row(pool_ptr + row * stride_pool, y, D, BLOCK_D, PK_FP4, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF,
                 PK_HAS_TAIL, PK_PAYLOAD, PK_ROW_BYTES)


@triton.jit
def _unpack_rows_kernel(packed_ptr, out_ptr, N, D, stride_p, stride_o, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                        PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr,
                        PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr):
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = r < N
    v = load_packed(packed_ptr + r.to(tl.int64) * stride_p, ok, 0, D, BLOCK_D, PK_NQ, PK_BLOCK, PK_TAIL_OFF,
                    PK_SCALE_OFF, PK_HAS_TAIL, out_ptr.dtype.element_ty)
    ch = tl.arange(0, BLOCK_D)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * stride_o + ch[None, :], v.to(out_ptr.dtype.element_ty),
             mask=ok[:, None] & (ch < D)[None, :])


def store_rows_triton(pool, rows, x, fmt):
    """pool[rows[i]] = pack(x[i]) (rows None: pool[i]); rows[i] < 0 skipped."""
    n, D = x.shape
    if n == 0:
        return
    if x.stride(1) != 1:
        x = x.contiguous()
    pk = packed_constexprs(fmt, D)
    _store_rows_kernel[(n,)](
        x, x if rows is None else rows.contiguous(), pool, D, x.stride(0), pool.stride(0), HAS_ROWS=rows is not None,
        BLOCK_D=max(triton.next_power_of_2(D), fmt.block), num_warps=store_warps(D), **pk,
    )


def store_warps(dim: int) -> int:
    """Warps of the store kernel: 8 channels (16 bytes of bf16) per thread, 1 to 4 warps."""
    return max(1, min(4, triton.next_power_of_2(dim) // 256))


UNPACK_ROWS = 16


def unpack_rows_triton(packed, fmt, dim, dtype):
    n = packed.shape[0]
    out = torch.empty(n, dim, dtype=dtype, device=packed.device)
    if n == 0:
        return out
    if fmt.value_bits != 8:
        raise ValueError(f"unpack_rows has a Triton kernel for the fp8 formats only, not {fmt.name}")
    pk = packed_constexprs(fmt, dim)
    pk.pop("PK_FP4"), pk.pop("PK_PAYLOAD"), pk.pop("PK_ROW_BYTES")
    _unpack_rows_kernel[(triton.cdiv(n, UNPACK_ROWS),)](
        packed, out, n, dim, packed.stride(0), out.stride(0), BLOCK_R=UNPACK_ROWS,
        BLOCK_D=max(triton.next_power_of_2(dim), fmt.block), num_warps=4, **pk,
    )
    return out
