"""mHC collapse (weighted sum of the streams): public entry point (math in hc_collapse_reference.py,
kernel in hc_collapse_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.hc_collapse_reference import hc_collapse_reference
from v4serve.ops.hc_collapse_triton import hc_collapse_triton
from v4serve.ops.norm_rope_reference import rms_norm_reference


def hc_collapse(streams: torch.Tensor, pre: torch.Tensor, norm_weight: torch.Tensor | None = None,
                eps: float | None = None, impl="auto") -> torch.Tensor:
    """y [T, D] in streams.dtype with y[t] = sum_j pre[t, j] streams[t, j] in fp32; streams [T, n, D],
    pre [T, n] fp32. n is a power of two. With `norm_weight` [D] and `eps`, y then goes through the
    sublayer's RMSNorm (`rms_norm_rope(y, eps, norm_weight)`'s math; one launch on the GPU)."""
    if streams.dim() != 3 or pre.shape != streams.shape[:2]:
        raise ValueError(f"streams must be [T, n, D] and pre [T, n], got {tuple(streams.shape)} and {tuple(pre.shape)}")
    n = streams.shape[1]
    if n & (n - 1):
        raise ValueError(f"the number of streams must be a power of two, got {n}")
    if (norm_weight is None) != (eps is None) or (norm_weight is not None and norm_weight.shape != streams.shape[2:]):
        raise ValueError(f"norm_weight must be [{streams.shape[2]}] and come with eps, got "
                         f"{None if norm_weight is None else tuple(norm_weight.shape)} with eps={eps}")
    if use_triton(impl, streams, pre):
        return hc_collapse_triton(streams, pre, norm_weight, eps)
    y = hc_collapse_reference(streams, pre)
    return y if norm_weight is None else rms_norm_reference(y, eps, norm_weight)
