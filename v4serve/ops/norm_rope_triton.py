"""Triton kernel of RMSNorm + interleaved partial RoPE (math: norm_rope_reference.py).

Layouts: x and out [N, D] (N = T * heads rows, unit stride along D, any row stride), weight [D],
cos and sin [T, R] fp32 (rope_dim = 2R, the last 2R channels rotate; row n uses token
n // heads). One program per row holds the whole row: it computes the row's scale
rsqrt(mean(x^2) + eps) in fp32, normalises (and weighs) each channel, rounds to the output dtype
as the reference does, then rotates each rope channel with its pair partner (channel c ^ 1,
loaded a second time: the same cache lines), and stores. NORM / HAS_WEIGHT / ROPE / INVERSE
select the parts, so RMSNorm alone, RoPE alone (the output's inverse rotation) and both (q, kv)
are each one launch.

Hadamard (HADAMARD, the index query): the finished row, rounded to the output dtype, is then
Walsh-Hadamard transformed in registers (hadamard_triton.hadamard_fp32, the reference's fp32
butterflies) and rounded again: the rotation, the cast and the transform in one launch (D a
power of two).

Packed store (PACKED, the window append): x [T, D] (heads 1) and pool uint8 rows of a packed
format; the program also quantizes and packs its finished row (rounded to the output dtype) into
pool[rows[t]] (kv_pack_triton.pack_row; skipped when rows[t] < 0).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.hadamard_triton import hadamard_fp32
from v4serve.ops.kv_pack_triton import pack_row, packed_constexprs


@triton.jit
def _normalized(x_ptr, w_ptr, cols, mask, scale, HAS_WEIGHT: tl.constexpr):
    """Channels `cols` of one row normalised by `scale` (and weighed), rounded to x's dtype, as fp32."""
    x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * scale
    if HAS_WEIGHT:
        y = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) * y
    return y.to(x_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _norm_rope_row(
    row, x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, pool_ptr, pool_rows_ptr,
    D, R, heads, eps, stride_x, stride_o, stride_cs, stride_pool,
    NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr, ROPE: tl.constexpr, INVERSE: tl.constexpr,
    BLOCK_D: tl.constexpr, HADAMARD: tl.constexpr, LOG2_D: tl.constexpr,
    PACKED: tl.constexpr, PK_FP4: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr,
    PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr,
    PK_PAYLOAD: tl.constexpr, PK_ROW_BYTES: tl.constexpr,
):
    """One row (int64 `row`): norm, rope, Hadamard, store, packed store, as the flags say."""
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    x_row = x_ptr + row * stride_x
    scale = 1.0
    if NORM:
        x = tl.load(x_row + cols, mask=ok, other=0.0).to(tl.float32)
        scale = tl.math.rsqrt(tl.sum(x * x, 0) / D + eps)
    y = _normalized(x_row, w_ptr, cols, ok, scale, HAS_WEIGHT and NORM)
    if ROPE:
        first = D - 2 * R
        in_rope = ok & (cols >= first)
        partner = _normalized(x_row, w_ptr, cols ^ 1, in_rope, scale, HAS_WEIGHT and NORM)
        pair = (cols - first) // 2
        tok = row // heads
        cos = tl.load(cos_ptr + tok * stride_cs + pair, mask=in_rope, other=1.0)
        sin = tl.load(sin_ptr + tok * stride_cs + pair, mask=in_rope, other=0.0)
        if INVERSE:
            sin = -sin
        # even channel: y cos - partner sin; odd channel: y cos + partner sin (first is even)
        signed_sin = tl.where((cols - first) % 2 == 0, -sin, sin)
        y = tl.where(in_rope, y * cos + partner * signed_sin, y)
    if HADAMARD:  # D == BLOCK_D: every channel is live
        y = hadamard_fp32(y.to(out_ptr.dtype.element_ty).to(tl.float32), BLOCK_D, LOG2_D)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)
    if PACKED:
        target = tl.load(pool_rows_ptr + row).to(tl.int64)
        if target >= 0:
            pack_row(pool_ptr + target * stride_pool, tl.where(ok, y, 0.0).to(out_ptr.dtype.element_ty).to(tl.float32),
                     D, BLOCK_D, PK_FP4, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_PAYLOAD, PK_ROW_BYTES)


@triton.jit
def _rms_norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, pool_ptr, pool_rows_ptr,
    D, R, heads, eps, stride_x, stride_o, stride_cs, stride_pool,
    NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr, ROPE: tl.constexpr, INVERSE: tl.constexpr,
    BLOCK_D: tl.constexpr, PDL: tl.constexpr = False, HADAMARD: tl.constexpr = False, LOG2_D: tl.constexpr = 0,
    PACKED: tl.constexpr = False, PK_FP4: tl.constexpr = False, PK_NQ: tl.constexpr = 0, PK_BLOCK: tl.constexpr = 1,
    PK_TAIL_OFF: tl.constexpr = 0, PK_SCALE_OFF: tl.constexpr = 0, PK_HAS_TAIL: tl.constexpr = False,
    PK_PAYLOAD: tl.constexpr = 0, PK_ROW_BYTES: tl.constexpr = 0,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    _norm_rope_row(tl.program_id(0).to(tl.int64), x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, pool_ptr, pool_rows_ptr,
                   D, R, heads, eps, stride_x, stride_o, stride_cs, stride_pool, NORM, HAS_WEIGHT, ROPE, INVERSE,
                   BLOCK_D, HADAMARD, LOG2_D, PACKED, PK_FP4, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                   PK_PAYLOAD, PK_ROW_BYTES)


@triton.jit
def _rms_norm_rope_pair_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, pool_ptr, pool_rows_ptr,
    D, R, heads, eps, stride_x, stride_o, stride_cs, stride_pool,
    x2_ptr, w2_ptr, out2_ptr, D2, stride_x2, n_rows,
    ROPE: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_D2: tl.constexpr, PDL: tl.constexpr = False,
    PACKED: tl.constexpr = False, PK_FP4: tl.constexpr = False, PK_NQ: tl.constexpr = 0, PK_BLOCK: tl.constexpr = 1,
    PK_TAIL_OFF: tl.constexpr = 0, PK_SCALE_OFF: tl.constexpr = 0, PK_HAS_TAIL: tl.constexpr = False,
    PK_PAYLOAD: tl.constexpr = 0, PK_ROW_BYTES: tl.constexpr = 0,
):
    """Programs 0..n_rows-1: weighted norm (+ rope, + packed store) of x's rows, as the kernel
    above; programs n_rows.. : the weighted RMSNorm of x2's rows (same eps) into out2."""
    if PDL:
        gdc_wait()
    row = tl.program_id(0).to(tl.int64)
    if row < n_rows:
        _norm_rope_row(row, x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, pool_ptr, pool_rows_ptr,
                       D, R, heads, eps, stride_x, stride_o, stride_cs, stride_pool, True, True, ROPE, False,
                       BLOCK_D, False, 0, PACKED, PK_FP4, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                       PK_PAYLOAD, PK_ROW_BYTES)
    else:
        _norm_rope_row(row - n_rows, x2_ptr, w2_ptr, x2_ptr, x2_ptr, out2_ptr, x2_ptr, x2_ptr,
                       D2, 0, 1, eps, stride_x2, D2, 0, 0, True, True, False, False,
                       BLOCK_D2, False, 0, False, False, 0, 1, 0, 0, False, 0, 0)


def norm_rope_warps(block_d: int) -> int:
    """Warps per row: about 256 channels per warp, 1 to 8."""
    return max(1, min(8, block_d // 256))


def rms_norm_rope_triton(x, eps=None, weight=None, cos=None, sin=None, inverse=False, pool=None, rows=None,
                         row_format=None, hadamard=False):
    D = x.shape[-1]
    rows_out = rows
    rows = x.reshape(-1, D)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = rows.shape[0]
    if n == 0:
        return out
    heads = max(1, n // cos.shape[0]) if cos is not None and cos.shape[0] else 1
    block_d = triton.next_power_of_2(D)
    cs = cos if cos is not None else rows  # unused pointers when ROPE is off
    pk = {} if pool is None else dict(PACKED=True, **packed_constexprs(row_format, D))
    if pk:
        block_d = max(block_d, row_format.block)
    _rms_norm_rope_kernel[(n,)](
        rows, weight if weight is not None else rows, cs, sin if sin is not None else rows, out,
        rows if pool is None else pool, rows if pool is None else rows_out.contiguous(),
        D, 0 if cos is None else cos.shape[-1], heads, 0.0 if eps is None else float(eps),
        rows.stride(0), D, 0 if cos is None else cos.stride(0), 0 if pool is None else pool.stride(0),
        NORM=eps is not None, HAS_WEIGHT=weight is not None, ROPE=cos is not None, INVERSE=inverse,
        BLOCK_D=block_d, num_warps=norm_rope_warps(block_d), **pdl_launch(rows), **pk,
        **(dict(HADAMARD=True, LOG2_D=D.bit_length() - 1) if hadamard else {}),
    )
    return out


def rms_norm_rope_pair_triton(x, eps, weight, cos, sin, x2, weight2, pool=None, rows=None, row_format=None):
    """(weighted norm + rope [+ packed store] of x [T, D], weighted norm of x2 [T2, D2]) in one
    launch of T + T2 programs; warps from the wider row (the narrower row's sum runs over the
    same number of warps, which may change its fp32 sum order against its own launch)."""
    D, D2 = x.shape[-1], x2.shape[-1]
    rows_out = rows
    xr = x if x.stride(-1) == 1 else x.contiguous()
    x2r = x2 if x2.stride(-1) == 1 else x2.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    out2 = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device)
    n, n2 = xr.shape[0], x2r.shape[0]
    if n + n2 == 0:
        return out, out2
    block_d, block_d2 = triton.next_power_of_2(D), triton.next_power_of_2(D2)
    pk = {} if pool is None else dict(PACKED=True, **packed_constexprs(row_format, D))
    if pk:
        block_d = max(block_d, row_format.block)
    rope = cos is not None
    _rms_norm_rope_pair_kernel[(n + n2,)](
        xr, weight, cos if rope else xr, sin if rope else xr, out,
        xr if pool is None else pool, xr if pool is None else rows_out.contiguous(),
        D, cos.shape[-1] if rope else 0, 1, float(eps), xr.stride(0), D, cos.stride(0) if rope else 0,
        0 if pool is None else pool.stride(0),
        x2r, weight2, out2, D2, x2r.stride(0), n,
        ROPE=rope, BLOCK_D=block_d, BLOCK_D2=block_d2, num_warps=norm_rope_warps(max(block_d, block_d2)),
        **pdl_launch(xr), **pk,
    )
    return out, out2
