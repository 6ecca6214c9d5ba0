"""Triton kernel of the decode columns (math: pick_columns_reference.py): the gather of the
top-k rows and their concatenation after the window columns in one launch instead of two.

Layouts: prefix [B, W] int32, rows_of [B, T] int32, order [B, >= k] int64 (any row strides, unit
column stride), out [B, W + k] int32 contiguous. One program per sequence b holds the whole output
row (BLOCK >= W + k lanes): lanes below W copy the prefix, the others load their rank's column from
`order` and gather rows_of at it (int32 words; the orders are in range by construction, the
sort's indices of a row of length T).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch


@triton.jit
def _pick_columns_kernel(prefix_ptr, rows_ptr, order_ptr, out_ptr, W, K,
                         stride_pb, stride_rb, stride_ob, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    b = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, BLOCK)
    in_prefix = lanes < W
    ranked = (lanes >= W) & (lanes < W + K)
    window = tl.load(prefix_ptr + b * stride_pb + lanes, mask=in_prefix, other=0)
    column = tl.load(order_ptr + b * stride_ob + (lanes - W), mask=ranked, other=0)
    picked = tl.load(rows_ptr + b * stride_rb + column, mask=ranked, other=0)
    tl.store(out_ptr + b * (W + K) + lanes, tl.where(in_prefix, window, picked), mask=in_prefix | ranked)


def pick_columns_triton(prefix: torch.Tensor, rows_of: torch.Tensor, order: torch.Tensor, k: int) -> torch.Tensor:
    B, W = prefix.shape
    out = torch.empty(B, W + k, dtype=torch.int32, device=prefix.device)
    if out.numel() == 0:
        return out
    block = triton.next_power_of_2(W + k)
    _pick_columns_kernel[(B,)](prefix, rows_of, order, out, W, k, prefix.stride(0), rows_of.stride(0),
                               order.stride(0), BLOCK=block, num_warps=max(1, min(4, block // 256)),
                               **pdl_launch(prefix))
    return out
