"""Torch reference of the mHC expand: the sublayer's output re-enters every stream.

    X'[t, k, d] = post[t, k] f[t, d] + sum_j comb[t, j, k] X[t, j, d]

computed as the model always has in the streams' dtype: post and comb are first rounded to it, the
mix is a matmul (fp32 accumulation, rounded), the product post * f is rounded, then the sum.
"""

import torch


def hc_expand_reference(output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    dtype = streams.dtype
    mixed = torch.matmul(comb.to(dtype).transpose(-1, -2), streams)
    return post.to(dtype).unsqueeze(-1) * output.unsqueeze(-2) + mixed
