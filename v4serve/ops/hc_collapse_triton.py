"""Triton kernel of the mHC collapse (math: hc_collapse_reference.py).

    y[t, d] = sum_j pre[t, j] X[t, j, d]          fp32 math, one rounding to y's dtype

Layouts: X [T, N, D] bf16 or fp32 (strides `stride_xt`, `stride_xn`, unit along D); pre [T, N]
fp32 contiguous; y [T, D] contiguous in X's dtype. N is a power of two (4 in V4).
Grid (T, cdiv(D, BLOCK_D)): a program reads its BLOCK_D channels of the N streams, stream by stream
(`collapse_channels`: the sum runs j = 0, 1, ..., N-1 in every channel, as the torch reference
sums, whatever tile or warp count the kernel has), and writes BLOCK_D outputs. One launch replaces
the multiply, sum and cast.

With the sublayer's RMSNorm (`_hc_collapse_norm_kernel`, the model's path): one program per token
holds the whole row (BLOCK_D >= D, norm_rope_warps(BLOCK_D) warps, as the norm's own kernel), writes
the collapsed row (the same per-channel sums as the plain kernel), and after a barrier normalises it
exactly as norm_rope_triton does (the same loads, the same reduction, `_normalized`), so the result
has the two launches' bits.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.norm_rope_triton import _normalized, norm_rope_warps

# 8 channels a thread (one 16-byte load per stream); the head's collapse, once a step, the only user.
HC_COLLAPSE_CONFIG = dict(BLOCK_D=1024, num_warps=4)


@triton.jit
def load_streams_tile(x_ptr, stride_xt, stride_xn, D, N: tl.constexpr, BLOCK_D: tl.constexpr):
    """The program's token t (axis 0) and channel block d (axis 1): (t, d, d_ok, j, the [N, BLOCK_D]
    tile of its N streams x[t, j, d])."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    j = tl.arange(0, N)
    x = tl.load(x_ptr + t * stride_xt + j[:, None] * stride_xn + d[None, :], mask=d_ok[None, :], other=0.0)
    return t, d, d_ok, j, x


@triton.jit
def collapse_channels(x_ptr, pre_ptr, t, d, d_ok, stride_xt, stride_xn, N: tl.constexpr):
    """sum_j pre[t, j] x[t, j, d] in fp32 over the channels d, the streams added in order (a sum per
    channel, no cross-thread reduction: the same bits under any layout)."""
    y = tl.zeros(d.shape, dtype=tl.float32)
    for j in tl.static_range(N):
        x = tl.load(x_ptr + t * stride_xt + j * stride_xn + d, mask=d_ok, other=0.0)
        y += tl.load(pre_ptr + t * N + j) * x.to(tl.float32)
    return y


@triton.jit
def _hc_collapse_kernel(
    x_ptr, pre_ptr, y_ptr, D, stride_xt, stride_xn,
    N: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    y = collapse_channels(x_ptr, pre_ptr, t, d, d_ok, stride_xt, stride_xn, N)
    tl.store(y_ptr + t * D + d, y.to(y_ptr.dtype.element_ty), mask=d_ok)


@triton.jit
def _hc_collapse_norm_kernel(
    x_ptr, pre_ptr, w_ptr, y_ptr, D, stride_xt, stride_xn, eps,
    N: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    t = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    ok = cols < D
    row = y_ptr + t * D
    collapsed = collapse_channels(x_ptr, pre_ptr, t, cols, ok, stride_xt, stride_xn, N)
    tl.store(row + cols, collapsed.to(y_ptr.dtype.element_ty), mask=ok)
    tl.debug_barrier()  # the collapsed row, rounded, is the norm's input: read back as norm_rope reads it
    y = tl.load(row + cols, mask=ok, other=0.0).to(tl.float32)
    scale = tl.math.rsqrt(tl.sum(y * y, 0) / D + eps)
    out = _normalized(row, w_ptr, cols, ok, scale, True)
    tl.debug_barrier()
    tl.store(row + cols, out.to(y_ptr.dtype.element_ty), mask=ok)


def hc_collapse_triton(streams: torch.Tensor, pre: torch.Tensor, norm_weight: torch.Tensor | None = None,
                       eps: float | None = None) -> torch.Tensor:
    """The collapse; with `norm_weight` and `eps`, then the weighted RMSNorm (one launch)."""
    T, n, D = streams.shape
    streams = streams if streams.stride(2) == 1 else streams.contiguous()
    pre = pre.float().contiguous()
    y = torch.empty(T, D, dtype=streams.dtype, device=streams.device)
    if T == 0:
        return y
    if norm_weight is not None:
        block_d = triton.next_power_of_2(D)
        _hc_collapse_norm_kernel[(T, 1)](
            streams, pre, norm_weight, y, D, streams.stride(0), streams.stride(1), float(eps), N=n, BLOCK_D=block_d,
            num_warps=norm_rope_warps(block_d), **pdl_launch(streams),
        )
        return y
    cfg = HC_COLLAPSE_CONFIG
    _hc_collapse_kernel[(T, triton.cdiv(D, cfg["BLOCK_D"]))](
        streams, pre, y, D, streams.stride(0), streams.stride(1), N=n, **cfg, **pdl_launch(streams),
    )
    return y
