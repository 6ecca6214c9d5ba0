"""mHC coefficients of a sublayer straight from its input streams (the mixer input and the
coefficients as one op): public entry point. Math: hc_mix_reference.py, then
hc_coefficients_reference.py; kernel: hc_mix_triton.py's mixer with its COEFFS epilogue (one
launch where `hc_mix` + `hc_coefficients` are two, with the same bits)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.hc_coefficients import check_coefficient_args
from v4serve.ops.hc_coefficients_reference import hc_coefficients_reference
from v4serve.ops.hc_mix import check_mix_args
from v4serve.ops.hc_mix_reference import hc_mix_reference
from v4serve.ops.hc_mix_triton import hc_mix_triton


def hc_stream_coefficients(x: torch.Tensor, fn: torch.Tensor, rms_eps: float, base: torch.Tensor, scale: torch.Tensor,
                           n: int, iters: int, hc_eps: float, tickets: torch.Tensor | None = None, impl="auto"
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [T, n], post [T, n], comb [T, n, n]) fp32 of the flattened streams x [T, n D] (any float
    dtype) for a sublayer's fn [(2+n)n, n D], base [(2+n)n], scale [3] fp32: `hc_coefficients` of
    `hc_mix(x, fn, rms_eps)`. `tickets`: as hc_mix's."""
    check_mix_args(x, fn)
    check_coefficient_args(fn.shape[0], base, n, iters)
    if use_triton(impl, x, fn, base, scale):
        coefficients = dict(base=base.float().contiguous(), scale=scale.float().contiguous(), n=n, iters=iters,
                            hc_eps=hc_eps)
        return hc_mix_triton(x, fn.float(), rms_eps, tickets, coefficients=coefficients)[2:]
    mixes, row_scale = hc_mix_reference(x, fn, rms_eps)
    return hc_coefficients_reference(mixes, row_scale, base, scale, n, iters, hc_eps)
