"""Triton kernel of the mHC expand (math: hc_expand_reference.py).

    X'[t, k, d] = round(round(post[t, k] f[t, d]) + round(sum_j comb[t, j, k] X[t, j, d]))

fp32 math, rounded to the streams' dtype exactly where the torch reference rounds (post and comb
first, the mix, the product, the sum), so bf16 results match it up to the mix's summation order.

Layouts: f [T, D] (unit stride along D, row stride `stride_ft`); X [T, N, D] (strides
`stride_xt`, `stride_xn`, unit along D); post [T, N], comb [T, N, N] fp32 contiguous; X' [T, N, D]
contiguous in X's dtype. N is a power of two (4 in V4).
Grid (T, cdiv(D, BLOCK_D)): a program reads its BLOCK_D channels of the N streams and the token's
post and comb, and writes the [N, BLOCK_D] tile of X'. One launch replaces the casts, the batched
matmul, the product and the sum. `expanded` adds the streams in order j = 0, 1, ..., N-1 in every
element (one multiply-add chain, no cross-thread reduction), so any kernel that runs it (the fused
expand + mixer, hc_expand_mix_triton.py) computes the same bits whatever its tile.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

# 8 channels a thread: one 16-byte load per stream (the streams are loaded one by one).
HC_EXPAND_CONFIG = dict(BLOCK_D=1024, num_warps=4)


@triton.jit
def expanded(f_ptrs, f_ok, post_k, comb_k_ptr, comb_ok, x_ptrs, x_ok, stride_xn, y_ptr, N: tl.constexpr):
    """X'_k = round(round(post_k f) + round(sum_j comb[j, k] X_j)) in y_ptr's element type, for
    broadcastable tiles: f_ptrs pointers to the sublayer's output at the channels (f_ok: mask),
    post_k (fp32) the stream's post, comb_k_ptr pointers to comb[t, 0, k] (comb_ok: their mask;
    stride N along j), x_ptrs pointers to X[t, 0, d] (x_ok: their mask; stride_xn along j). The
    output is loaded last, after the streams: fewer registers live at once."""
    dtype = y_ptr.dtype.element_ty
    x = tl.load(x_ptrs, mask=x_ok, other=0.0).to(tl.float32)
    mixed = tl.load(comb_k_ptr, mask=comb_ok, other=0.0).to(dtype).to(tl.float32) * x
    for j in tl.static_range(1, N):
        x = tl.load(x_ptrs + j * stride_xn, mask=x_ok, other=0.0).to(tl.float32)
        mixed += tl.load(comb_k_ptr + j * N, mask=comb_ok, other=0.0).to(dtype).to(tl.float32) * x
    mixed = mixed.to(dtype).to(tl.float32)
    f = tl.load(f_ptrs, mask=f_ok, other=0.0).to(tl.float32)
    scaled = (post_k.to(dtype).to(tl.float32) * f).to(dtype).to(tl.float32)
    return (scaled + mixed).to(dtype)


@triton.jit
def _hc_expand_kernel(
    f_ptr, x_ptr, post_ptr, comb_ptr, y_ptr, D, stride_ft, stride_xt, stride_xn,
    N: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = d < D
    k = tl.arange(0, N)
    post = tl.load(post_ptr + t * N + k)
    # The stream and output loads are [BLOCK_D] rows (16 bytes a thread), broadcast over the N outputs.
    out = expanded(f_ptr + t * stride_ft + d, d_ok, post[:, None], (comb_ptr + t * N * N + k)[:, None],
                   k[:, None] < N, x_ptr + t * stride_xt + d, d_ok, stride_xn, y_ptr, N)
    tl.store(y_ptr + t * N * D + k[:, None] * D + d[None, :], out, mask=d_ok[None, :])


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
