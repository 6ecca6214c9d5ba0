"""Torch reference of the fp32 output head over bf16 weights (DeepSeek-V4.1, `plan.fp32_head`).

    x       fp32 [M, K]     the final normed hidden states of the rows that need logits
    weight  bf16 [N, K]     the checkpoint's head (V4.1 stores it in bf16 and computes in fp32)
    y[m, n] = sum_k x[m, k] * float(weight[n, k])      fp32 [M, N]

Widening bf16 to fp32 is exact, so this is an fp32 GEMM of the checkpoint's values; results differ
only by the fp32 summation order between implementations. The reference widens the whole weight
(a vocab x hidden fp32 temporary, 2x the weight's bytes): the kernel widens each tile in registers.
"""

import torch


def fp32_head_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x.float(), weight.float())
