"""mHC coefficients of a sublayer: public entry point (math in hc_coefficients_reference.py, kernel
in hc_coefficients_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.hc_coefficients_reference import hc_coefficients_reference
from v4serve.ops.hc_coefficients_triton import hc_coefficients_triton


def check_coefficient_args(width: int, base: torch.Tensor, n: int, iters: int) -> None:
    """`width` mixes per token ((2+n)n) and base [(2+n)n]; n a power of two, iters >= 1."""
    if width != (2 + n) * n or base.shape != (width,):
        raise ValueError(f"mixes must be [T, {(2 + n) * n}] and base [{(2 + n) * n}], got {width} mixes per token "
                         f"and base {tuple(base.shape)}")
    if n & (n - 1) or iters < 1:
        raise ValueError(f"n must be a power of two and iters >= 1, got n={n}, iters={iters}")


def hc_coefficients(mixes, row_scale, base, scale, n: int, iters: int, eps: float, impl="auto"):
    """(pre [T, n], post [T, n], comb [T, n, n]) in fp32 from mixes [T, (2+n)n] (un-normalised
    fn @ flatten(X)), row_scale [T] (the rsqrt(mean(X^2) + eps) of each token), base, scale [3]."""
    if mixes.dim() != 2:
        raise ValueError(f"mixes must be [T, {(2 + n) * n}], got {tuple(mixes.shape)}")
    check_coefficient_args(mixes.shape[1], base, n, iters)
    if use_triton(impl, mixes, row_scale, base, scale) and mixes.stride(1) == 1:
        return hc_coefficients_triton(mixes, row_scale.float().contiguous(), base.float().contiguous(),
                                      scale.float().contiguous(), n, iters, eps)
    return hc_coefficients_reference(mixes, row_scale, base, scale, n, iters, eps)
