"""Triton kernel of RMSNorm + interleaved partial RoPE (math: norm_rope_reference.py).

Layouts: x and out [N, D] (N = T * heads rows, unit stride along D, any row stride), weight [D],
cos and sin [T, R] fp32 (rope_dim = 2R, the last 2R channels rotate; row n uses token
n // heads). One program per row holds the whole row: it computes the row's scale
rsqrt(mean(x^2) + eps) in fp32, normalises (and weighs) each channel, rounds to the output dtype
as the reference does, then rotates each rope channel with its pair partner (channel c ^ 1,
loaded a second time: the same cache lines), and stores. NORM / HAS_WEIGHT / ROPE / INVERSE
select the parts, so RMSNorm alone, RoPE alone (the output's inverse rotation) and both (q, kv)
are each one launch.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch


@triton.jit
def _normalized(x_ptr, w_ptr, cols, mask, scale, HAS_WEIGHT: tl.constexpr):
    """Channels `cols` of one row normalised by `scale` (and weighed), rounded to x's dtype, as fp32."""
    x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = x * scale
    if HAS_WEIGHT:
        y = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32) * y
    return y.to(x_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _rms_norm_rope_kernel(
    x_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr,
    D, R, heads, eps, stride_x, stride_o, stride_cs,
    NORM: tl.constexpr, HAS_WEIGHT: tl.constexpr, ROPE: tl.constexpr, INVERSE: tl.constexpr,
    BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    row = tl.program_id(0).to(tl.int64)
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
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=ok)


def norm_rope_warps(block_d: int) -> int:
    """Warps per row: about 256 channels per warp, 1 to 8."""
    return max(1, min(8, block_d // 256))


def rms_norm_rope_triton(x, eps=None, weight=None, cos=None, sin=None, inverse=False, pool=None, rows=None,
                         row_format=None):
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
    _rms_norm_rope_kernel[(n,)](
        rows, weight if weight is not None else rows, cs, sin if sin is not None else rows, out,
        D, 0 if cos is None else cos.shape[-1], heads, 0.0 if eps is None else float(eps),
        rows.stride(0), D, 0 if cos is None else cos.stride(0),
        NORM=eps is not None, HAS_WEIGHT=weight is not None, ROPE=cos is not None, INVERSE=inverse,
        BLOCK_D=block_d, num_warps=norm_rope_warps(block_d), **pdl_launch(rows),
    )
    if pool is not None:
        from v4serve.ops.kv_pack import store_rows

        store_rows(pool, rows_out, out, row_format, impl="triton")
    return out
