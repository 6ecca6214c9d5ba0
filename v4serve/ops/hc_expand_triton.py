"""Triton kernel of the mHC expand (math: hc_expand_reference.py).

    X'[t, k, d] = round(round(post[t, k] f[t, d]) + round(sum_j comb[t, j, k] X[t, j, d]))

fp32 math, rounded to the streams' dtype exactly where the torch reference rounds (post and comb
first, the mix, the product, the sum), so bf16 results match it up to the mix's summation order.

Layouts: f [T, D] (unit stride along D, row stride `stride_ft`); X [T, N, D] (strides
`stride_xt`, `stride_xn`, unit along D); post [T, N], comb [T, N, N] fp32 contiguous; X' [T, N, D]
contiguous in X's dtype. N is a power of two (4 in V4).
Grid (T, cdiv(D, BLOCK_D)): a program reads its [N, BLOCK_D] tile of X, the token's post and comb,
and writes the [N, BLOCK_D] tile of X'. One launch replaces the casts, the batched matmul, the
product and the sum.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.hc_collapse_triton import load_streams_tile

HC_EXPAND_CONFIG = dict(BLOCK_D=512, num_warps=4)


@triton.jit
def _hc_expand_kernel(
    f_ptr, x_ptr, post_ptr, comb_ptr, y_ptr, D, stride_ft, stride_xt, stride_xn,
    N: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    t, d, d_ok, j, x = load_streams_tile(x_ptr, stride_xt, stride_xn, D, N, BLOCK_D)
    dtype = y_ptr.dtype.element_ty
    f = tl.load(f_ptr + t * stride_ft + d, mask=d_ok, other=0.0).to(tl.float32)
    comb = tl.load(comb_ptr + t * N * N + j[:, None] * N + j[None, :]).to(dtype).to(tl.float32)  # [j, k]
    post = tl.load(post_ptr + t * N + j).to(dtype).to(tl.float32)
    mixed = tl.sum(comb[:, :, None] * x.to(tl.float32)[:, None, :], axis=0)  # [k, BLOCK_D]
    mixed = mixed.to(dtype).to(tl.float32)
    scaled = (post[:, None] * f[None, :]).to(dtype).to(tl.float32)
    out = (scaled + mixed).to(dtype)
    tl.store(y_ptr + t * N * D + j[:, None] * D + d[None, :], out, mask=d_ok[None, :])


def hc_expand_triton(output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    T, n, D = streams.shape
    streams = streams if streams.stride(2) == 1 else streams.contiguous()
    output = output if output.stride(1) == 1 else output.contiguous()
    y = torch.empty(T, n, D, dtype=streams.dtype, device=streams.device)
    if T == 0:
        return y
    cfg = HC_EXPAND_CONFIG
    _hc_expand_kernel[(T, triton.cdiv(D, cfg["BLOCK_D"]))](
        output, streams, post.float().contiguous(), comb.float().contiguous(), y, D,
        output.stride(0), streams.stride(0), streams.stride(1), N=n, **cfg, **pdl_launch(output),
    )
    return y
