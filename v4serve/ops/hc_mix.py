"""mHC mixer input (mixes and RMS factor): public entry point (math in hc_mix_reference.py, kernel
in hc_mix_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.hc_mix_reference import hc_mix_reference
from v4serve.ops.hc_mix_triton import hc_mix_triton


def check_mix_args(x: torch.Tensor, fn: torch.Tensor) -> None:
    if x.dim() != 2 or fn.dim() != 2 or fn.shape[1] != x.shape[1]:
        raise ValueError(f"x must be [T, K] and fn [M, K], got {tuple(x.shape)} and {tuple(fn.shape)}")


def hc_mix(x: torch.Tensor, fn: torch.Tensor, eps: float, tickets: torch.Tensor | None = None,
           impl="auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(mixes [T, M], row_scale [T]) in fp32 for x [T, K] (any float dtype; the flattened streams)
    and fn [M, K] fp32: mixes = x @ fn^T, row_scale = rsqrt(mean(x^2) + eps). `tickets`: zeroed
    int32 counters the kernel may use (and leaves zeroed), such as the cache's; else it allocates."""
    check_mix_args(x, fn)
    if use_triton(impl, x, fn):
        return hc_mix_triton(x, fn.float(), eps, tickets)
    return hc_mix_reference(x, fn, eps)
