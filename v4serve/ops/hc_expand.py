"""mHC expand (the sublayer's output back into the streams): public entry point (math in
hc_expand_reference.py, kernel in hc_expand_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.hc_expand_reference import hc_expand_reference
from v4serve.ops.hc_expand_triton import hc_expand_triton


def hc_expand(output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
              impl="auto") -> torch.Tensor:
    """X' [T, n, D] in streams.dtype: X'[:, k] = post[:, k] output + sum_j comb[:, j, k] streams[:, j].

    output [T, D] in streams.dtype; streams [T, n, D]; post [T, n], comb [T, n, n] fp32."""
    check_expand_args(output, streams, post, comb)
    if use_triton(impl, output, streams, post, comb):
        return hc_expand_triton(output, streams, post, comb)
    return hc_expand_reference(output, streams, post, comb)


def check_expand_args(output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> None:
    if streams.dim() != 3 or output.shape != (streams.shape[0], streams.shape[2]):
        raise ValueError(f"streams must be [T, n, D] and output [T, D], got {tuple(streams.shape)} and "
                         f"{tuple(output.shape)}")
    T, n, _ = streams.shape
    if post.shape != (T, n) or comb.shape != (T, n, n):
        raise ValueError(f"post must be [{T}, {n}] and comb [{T}, {n}, {n}], got {tuple(post.shape)} and "
                         f"{tuple(comb.shape)}")
    if output.dtype != streams.dtype or n & (n - 1):
        raise ValueError(f"output must have the streams' dtype {streams.dtype} (got {output.dtype}) and the "
                         f"number of streams must be a power of two (got {n})")
