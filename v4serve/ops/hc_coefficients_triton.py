"""Triton kernel of the mHC coefficients (math in hc_coefficients_reference.py).

One program per BLOCK_T tokens; each token's pre [n], post [n] and n x n mixing matrix C live in
registers through the softmax and all Sinkhorn rounds, so a sublayer's coefficients are one
launch instead of ~90 small ones (the 19 Sinkhorn rounds alone are 76 in torch).

Layouts: mixes [T, (2+n)n] fp32 (row stride `stride_m`), row_scale [T], base [(2+n)n], scale [3];
outputs pre [T, n], post [T, n], comb [T, n, n], fp32, contiguous. n is a power of two (4 in V4).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

# Two tokens per one-warp program: each thread holds one entry of a token's 4 x 4 matrix, so every
# Sinkhorn row or column sum is two warp shuffles. H200 (Triton 3.6, do_bench_cudagraph): 3.1 µs at
# T = 1, 8 or 64 and 3.9 µs at T = 2048, against 8.7-9.2 µs for 32 tokens over 4 warps (4 entries a
# thread, one serial chain of 40 normalisations); 8 tokens x 4 warps 3.9-4.5 µs.
HC_CONFIG = dict(BLOCK_T=2, num_warps=1)


@triton.jit
def _row_sums(c, BLOCK_T: tl.constexpr, N: tl.constexpr, LOG2_N: tl.constexpr):
    """sum_k c[t, j, k] of c [BLOCK_T, N, N] as a fixed pairwise tree ((c0 + c1) + (c2 + c3) for
    N = 4, the order of a one-warp shuffle reduction over adjacent lanes), whatever the layout the
    compiler picks for c: the kernels that run this code get the same bits. -> [BLOCK_T, N, 1]."""
    for i in tl.static_range(LOG2_N):
        a, b = tl.split(tl.reshape(c, (BLOCK_T, N, N >> (i + 1), 2)))
        c = a + b
    return c


@triton.jit
def coefficients_of_tokens(mix_ptr, row_scale_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, t, t_ok, stride_m,
                           N: tl.constexpr, ITERS: tl.constexpr, EPS: tl.constexpr, BLOCK_T: tl.constexpr):
    """pre, post and C of the tokens t [BLOCK_T] (t_ok: live) from their mixes and RMS factors in
    memory; the mixer kernel (hc_mix_triton.py) runs it as its epilogue. Row and column sums are
    explicit pairwise trees (`_row_sums`; columns through the transpose), so the standalone kernel
    and the epilogue, whose tiles differ, compute the same bits."""
    LOG2_N: tl.constexpr = N.bit_length() - 1
    j = tl.arange(0, N)
    rs = tl.load(row_scale_ptr + t, mask=t_ok, other=0.0)
    s0 = tl.load(scale_ptr)
    s1 = tl.load(scale_ptr + 1)
    s2 = tl.load(scale_ptr + 2)
    row = mix_ptr + t.to(tl.int64)[:, None] * stride_m
    pre = tl.load(row + j[None, :], mask=t_ok[:, None], other=0.0) * rs[:, None]
    pre = tl.sigmoid(pre * s0 + tl.load(base_ptr + j)[None, :]) + EPS
    post = tl.load(row + N + j[None, :], mask=t_ok[:, None], other=0.0) * rs[:, None]
    post = 2.0 * tl.sigmoid(post * s1 + tl.load(base_ptr + N + j)[None, :])
    jk = j[:, None] * N + j[None, :]  # [N, N] offsets of C[j, k]
    c = tl.load(row[:, :, None] + 2 * N + jk[None, :, :], mask=t_ok[:, None, None], other=0.0)
    c = c * rs[:, None, None] * s2 + tl.load(base_ptr + 2 * N + jk)[None, :, :]
    c = tl.exp(c - tl.max(c, axis=2)[:, :, None])
    c = c / _row_sums(c, BLOCK_T, N, LOG2_N) + EPS
    c = c / (tl.permute(_row_sums(tl.permute(c, (0, 2, 1)), BLOCK_T, N, LOG2_N), (0, 2, 1)) + EPS)
    for _ in tl.static_range(ITERS - 1):
        c = c / (_row_sums(c, BLOCK_T, N, LOG2_N) + EPS)
        c = c / (tl.permute(_row_sums(tl.permute(c, (0, 2, 1)), BLOCK_T, N, LOG2_N), (0, 2, 1)) + EPS)
    out = t.to(tl.int64)[:, None] * N + j[None, :]
    tl.store(pre_ptr + out, pre, mask=t_ok[:, None])
    tl.store(post_ptr + out, post, mask=t_ok[:, None])
    tl.store(comb_ptr + t.to(tl.int64)[:, None, None] * (N * N) + jk[None, :, :], c, mask=t_ok[:, None, None])


@triton.jit
def _hc_coefficients_kernel(
    mix_ptr, row_scale_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, T, stride_m,
    N: tl.constexpr, ITERS: tl.constexpr, EPS: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    coefficients_of_tokens(mix_ptr, row_scale_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, t, t < T, stride_m,
                           N, ITERS, EPS, BLOCK_T)


def hc_coefficients_triton(mixes, row_scale, base, scale, n: int, iters: int, eps: float):
    t = mixes.shape[0]
    pre = torch.empty(t, n, dtype=torch.float32, device=mixes.device)
    post = torch.empty_like(pre)
    comb = torch.empty(t, n, n, dtype=torch.float32, device=mixes.device)
    _hc_coefficients_kernel[(triton.cdiv(t, HC_CONFIG["BLOCK_T"]),)](
        mixes, row_scale, base, scale, pre, post, comb, t, mixes.stride(0),
        N=n, ITERS=iters, EPS=eps, **HC_CONFIG, **pdl_launch(mixes),
    )
    return pre, post, comb
