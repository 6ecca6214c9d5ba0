"""Triton code of the mHC head's collapse weights (math: hc_head_pre_reference.py), run as the
mixer kernel's HEAD_PRE epilogue (hc_mix_triton.py): the program that writes a token block's
mixes [T, n] and RMS factors [T] (fp32) turns them into pre [T, n] fp32 (contiguous), with base
[n] and scale [1] fp32. The product keeps the reference's association, m * (row_scale * scale);
the compiler may contract the multiply and the add of base into one FMA (one rounding fewer)."""

import triton
import triton.language as tl


@triton.jit
def head_pre_of_tokens(mix_ptr, row_scale_ptr, base_ptr, scale_ptr, pre_ptr, t, t_ok, N: tl.constexpr,
                       EPS: tl.constexpr):
    """pre[t, j] = sigmoid(mixes[t, j] * (row_scale[t] * scale) + base[j]) + EPS for the tokens t
    (t_ok: live); mixes and pre have row stride N."""
    j = tl.arange(0, N)
    factor = tl.load(row_scale_ptr + t, mask=t_ok, other=0.0) * tl.load(scale_ptr)
    rows = t.to(tl.int64)[:, None] * N + j[None, :]
    mixes = tl.load(mix_ptr + rows, mask=t_ok[:, None], other=0.0)
    pre = tl.sigmoid(mixes * factor[:, None] + tl.load(base_ptr + j)[None, :]) + EPS
    tl.store(pre_ptr + rows, pre, mask=t_ok[:, None])
