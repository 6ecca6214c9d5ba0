"""Triton kernel of the MoE grouped matmul: y[m] = x[rows[m]] @ weight[g(m)]^T.

Layouts: x [T, K] (row stride `stride_x`, unit column stride); weight [E, N, K] row-major per
group (an expert's nn.Linear weight); rows [M] int64 sorted by group; ends [E] int32 cumulative
group ends; y [M, N].

Work is cut into blocks of BLOCK_M picks of one group: group e owns cdiv(size_e, BLOCK_M) blocks,
numbered after those of the groups before it (`block_ends`, cumulative, computed on the device);
`block_group[b]` names block b's group (E past the last block). Grid (max_blocks, cdiv(N, BLOCK_N))
with max_blocks = cdiv(M, BLOCK_M) + E, an upper bound known on the host: program (b, n) gathers
its block's x rows and runs over K in BLOCK_K steps with a tensor-core dot, fp32 accumulation;
programs past the last block exit at once. No host-side count: the kernel runs inside CUDA
graphs. Blocks, not groups, spread over the GPU, so one expert with many picks (a decode batch
whose tokens agree) does not serialise on a few programs.
"""

import torch
import triton
import triton.language as tl

# Production tiles: BLOCK_M 16 (decode puts a handful of picks on an expert), 4 warps.
GROUPED_MATMUL_CONFIG = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)


@triton.jit
def _grouped_matmul_kernel(
    x_ptr, w_ptr, rows_ptr, ends_ptr, block_group_ptr, block_ends_ptr, y_ptr,
    N, K, stride_x, stride_we, stride_wn, stride_y,
    N_GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    block = tl.program_id(0)
    e = tl.load(block_group_ptr + block)
    if e >= N_GROUPS:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    start = tl.load(ends_ptr + e - 1, mask=e > 0, other=0)
    end = tl.load(ends_ptr + e)
    first_block = tl.load(block_ends_ptr + e - 1, mask=e > 0, other=0)
    offs_m = start + (block - first_block) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < end
    rows = tl.load(rows_ptr + offs_m, mask=mask_m, other=0)
    w_group = w_ptr + e.to(tl.int64) * stride_we
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
    cfg = GROUPED_MATMUL_CONFIG
    block_m = cfg["BLOCK_M"]
    sizes = torch.diff(ends, prepend=ends.new_zeros(1))
    block_ends = ((sizes + block_m - 1) // block_m).cumsum(0, dtype=torch.int32)
    max_blocks = triton.cdiv(rows.shape[0], block_m) + e
    blocks = torch.arange(max_blocks, device=x.device, dtype=torch.int32)
    block_group = torch.searchsorted(block_ends, blocks, right=True).to(torch.int32)
    y = torch.empty(rows.shape[0], n, dtype=x.dtype, device=x.device)
    grid = (max_blocks, triton.cdiv(n, cfg["BLOCK_N"]))
    _grouped_matmul_kernel[grid](
        x, weight, rows, ends, block_group, block_ends, y, n, k, x.stride(0), weight.stride(0), weight.stride(1),
        y.stride(0), N_GROUPS=e, BLOCK_M=block_m, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return y
