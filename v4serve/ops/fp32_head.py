"""fp32 output head over bf16 weights: public entry point (math in fp32_head_reference.py, kernel
in fp32_head_triton.py).

    fp32_head(x fp32 [M, K], weight bf16 [N, K], impl="auto") -> fp32 [M, N]

(an fp32 weight, as a float32 model holds it, is read as it is.)

The head weight stays bf16 in memory (1.06 GB at V4.1-Flash's 129280 x 4096): no fp32 copy, and a
decode step reads half the bytes a cuBLAS fp32 GEMM over a widened copy would.
"""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.fp32_head_reference import fp32_head_reference
from v4serve.ops.fp32_head_triton import fp32_head_triton


def fp32_head(x: torch.Tensor, weight: torch.Tensor, impl: str = "auto") -> torch.Tensor:
    if x.dim() != 2 or x.dtype != torch.float32:
        raise ValueError(f"x must be fp32 [M, K], got {x.dtype} {tuple(x.shape)}")
    if weight.dim() != 2 or weight.dtype not in (torch.bfloat16, torch.float32) or weight.shape[1] != x.shape[1]:
        raise ValueError(f"weight must be bf16 or fp32 [N, {x.shape[1]}], got {weight.dtype} {tuple(weight.shape)}")
    if use_triton(impl, x, weight):
        return fp32_head_triton(x, weight)
    return fp32_head_reference(x, weight)
