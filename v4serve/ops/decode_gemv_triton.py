"""Triton kernel of the decode GEMV (math: decode_gemv_reference.py).

Layouts: x [T, K] (unit stride along K, row stride `stride_x`), W [N, K] contiguous, y [T, N]
contiguous, x and W of one float dtype; T <= BLOCK_T (8).

Grid (cdiv(N, BLOCK_N),): a program owns BLOCK_N rows of W and every row of x; per BLOCK_K step it
loads its [BLOCK_N, BLOCK_K] weight tile once (16-byte loads) and the [BLOCK_T, BLOCK_K] slice of x,
and accumulates the [BLOCK_T, BLOCK_N] products in fp32 (a broadcast multiply and a sum over K: no
tensor cores, which would need 16 rows). One launch, no split-K: the V4-Flash router (2 MB) is
spread over 128 programs of 2 rows, where cuBLAS runs a split-K GEMM and a reduction kernel.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

DECODE_GEMV_CONFIG = dict(BLOCK_T=8, BLOCK_N=2, BLOCK_K=512, num_warps=4)
MAX_ROWS = DECODE_GEMV_CONFIG["BLOCK_T"]


@triton.jit
def _decode_gemv_kernel(x_ptr, w_ptr, y_ptr, T, N, K, stride_x,
                        BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        PDL: tl.constexpr = False):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    t = tl.arange(0, BLOCK_T)
    n_ok, t_ok = n < N, t < T
    acc = tl.zeros([BLOCK_T, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        w = tl.load(w_ptr + n.to(tl.int64)[:, None] * K + k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)
        x = tl.load(x_ptr + t[:, None] * stride_x + k[None, :], mask=t_ok[:, None] & k_ok[None, :],
                    other=0.0).to(tl.float32)
        acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    tl.store(y_ptr + t[:, None] * N + n[None, :], acc.to(y_ptr.dtype.element_ty), mask=t_ok[:, None] & n_ok[None, :])


def decode_gemv_triton(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    T, K = x.shape
    N = weight.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    y = torch.empty(T, N, dtype=x.dtype, device=x.device)
    if T == 0:
        return y
    cfg = DECODE_GEMV_CONFIG
    _decode_gemv_kernel[(triton.cdiv(N, cfg["BLOCK_N"]),)](
        x, weight.contiguous(), y, T, N, K, x.stride(0), **cfg, **pdl_launch(x),
    )
    return y
