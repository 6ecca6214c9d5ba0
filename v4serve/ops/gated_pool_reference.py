"""Torch reference of the compressor's gated pool.

    out[b, d] = sum_r kv[b, r, d] * softmax_r(score[b, :, d])        (fp32)

A -inf score gives its row weight 0. A column whose R scores are all -inf has no defined
softmax (the result is NaN): callers never pool a block with no rows.
"""

import torch


def gated_pool_reference(kv: torch.Tensor, score: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    weights = torch.softmax(score.float(), dim=1)
    return (kv.float() * weights).sum(1).to(out_dtype)
