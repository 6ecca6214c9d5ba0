"""Triton kernel of the MoE grouped matmul: y[m] = x[rows[m]] @ weight[g(m)]^T.

Layouts: x [T, K] (row stride `stride_x`, unit column stride); weight [E, N, K] row-major per
group (an expert's nn.Linear weight); rows [M] int64 sorted by group, or none (row m = pick m);
ends [E] int32 cumulative group ends; y [M, N].

Work is cut into blocks of BLOCK_M picks of one group: group e owns cdiv(size_e, BLOCK_M) blocks,
numbered after those of the groups before it. Each program derives that schedule itself from
`ends` (E values, one load, a cumulative sum in registers): the block count per group, their
running total, and from it its own group, first pick and last pick; so no setup launches and no
host-side count, and the kernel runs inside CUDA graphs. Grid (max_blocks, cdiv(N, BLOCK_N)) with
max_blocks = cdiv(M, BLOCK_M) + E, an upper bound known on the host; programs past the last block
exit at once. Program (b, n) gathers its block's x rows and runs over K in BLOCK_K steps with a
tensor-core dot, fp32 accumulation. Blocks, not groups, spread over the GPU, so one expert with
many picks (a decode batch whose tokens agree) does not serialise on a few programs.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

# Production tiles: BLOCK_M 16 (decode puts a handful of picks on an expert), 4 warps.
GROUPED_MATMUL_CONFIG = dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=3)


@triton.jit
def group_block(ends_ptr, block, N_GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """The block schedule, from the group ends: group e's blocks are [first_e, first_e + blocks_e).
    -> (e, the block's pick indices [BLOCK_M], their mask); e == N_GROUPS past the last block."""
    groups = tl.arange(0, BLOCK_E)
    group_ok = groups < N_GROUPS
    ends = tl.load(ends_ptr + groups, mask=group_ok, other=0)
    starts = tl.load(ends_ptr + groups - 1, mask=group_ok & (groups > 0), other=0)
    blocks = tl.where(group_ok, (ends - starts + BLOCK_M - 1) // BLOCK_M, 0)
    block_ends = tl.cumsum(blocks, 0)
    e = tl.sum((block_ends <= block).to(tl.int32), 0)  # the group whose blocks cover this one
    mine = groups == e
    start = tl.sum(tl.where(mine, starts, 0), 0)
    end = tl.sum(tl.where(mine, ends, 0), 0)
    first_block = tl.sum(tl.where(mine, block_ends - blocks, 0), 0)
    offs_m = start + (block - first_block) * BLOCK_M + tl.arange(0, BLOCK_M)
    return e, offs_m, offs_m < end


@triton.jit
def _grouped_matmul_kernel(
    x_ptr, w_ptr, rows_ptr, ends_ptr, y_ptr,
    N, K, stride_x, stride_we, stride_wn, stride_y,
    N_GROUPS: tl.constexpr, HAS_ROWS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    e, offs_m, mask_m = group_block(ends_ptr, tl.program_id(0), N_GROUPS, BLOCK_M, BLOCK_E)
    if e >= N_GROUPS:
        return
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if HAS_ROWS:
        rows = tl.load(rows_ptr + offs_m, mask=mask_m, other=0)
    else:
        rows = offs_m.to(tl.int64)
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


def grouped_matmul_triton(x: torch.Tensor, weight: torch.Tensor, rows: torch.Tensor | None, ends: torch.Tensor,
                          n_picks: int) -> torch.Tensor:
    e, n, k = weight.shape
    cfg = GROUPED_MATMUL_CONFIG
    block_m = cfg["BLOCK_M"]
    y = torch.empty(n_picks, n, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(n_picks, block_m) + e, triton.cdiv(n, cfg["BLOCK_N"]))
    _grouped_matmul_kernel[grid](
        x, weight, rows if rows is not None else ends, ends, y, n, k, x.stride(0), weight.stride(0),
        weight.stride(1), y.stride(0), N_GROUPS=e, HAS_ROWS=rows is not None, BLOCK_M=block_m,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], BLOCK_E=triton.next_power_of_2(e),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_launch(x),
    )
    return y
