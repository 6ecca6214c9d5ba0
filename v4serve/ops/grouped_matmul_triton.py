"""Triton kernel of the MoE grouped matmul: y[m] = x[rows[m]] @ weight[g(m)]^T.

Layouts: x [T, K] (row stride `stride_x`, unit column stride); weight [E, N, K] row-major per
group (an expert's nn.Linear weight); rows [M] int64 sorted by group; ends [E] int32 cumulative
group ends; y [M, N].

Grid (E, cdiv(N, BLOCK_N)): program (e, n) reads its group's bounds from device memory, loops over
the group's picks BLOCK_M at a time (gathering their x rows), and over K in BLOCK_K steps with a
tensor-core dot, fp32 accumulation. A group with no picks exits at once, so the grid needs no
host-side count and the kernel runs inside CUDA graphs; each used expert's weight tile is read
once per BLOCK_M picks.
"""

import torch
import triton
import triton.language as tl

# Production tiles: BLOCK_M 16 (decode puts a handful of picks on an expert), 4 warps.
GROUPED_MATMUL_CONFIG = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)


@triton.jit
def _grouped_matmul_kernel(
    x_ptr, w_ptr, rows_ptr, ends_ptr, y_ptr,
    N, K, stride_x, stride_we, stride_wn, stride_y,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    e = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(ends_ptr + e - 1, mask=e > 0, other=0)
    end = tl.load(ends_ptr + e)
    w_group = w_ptr + e.to(tl.int64) * stride_we
    for m0 in range(start, end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        mask_m = offs_m < end
        rows = tl.load(rows_ptr + offs_m, mask=mask_m, other=0)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :],
                        mask=mask_m[:, None] & (offs_k[None, :] < K), other=0.0)
            b = tl.load(w_group + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None],
                        mask=(offs_n[None, :] < N) & (offs_k[:, None] < K), other=0.0)
            acc += tl.dot(a, b)
        tl.store(y_ptr + offs_m[:, None].to(tl.int64) * stride_y + offs_n[None, :],
                 acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & (offs_n[None, :] < N))


def grouped_matmul_triton(x: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    e, n, k = weight.shape
    y = torch.empty(rows.shape[0], n, dtype=x.dtype, device=x.device)
    cfg = GROUPED_MATMUL_CONFIG
    grid = (e, triton.cdiv(n, cfg["BLOCK_N"]))
    _grouped_matmul_kernel[grid](
        x, weight, rows, ends, y, n, k, x.stride(0), weight.stride(0), weight.stride(1), y.stride(0),
        BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return y
