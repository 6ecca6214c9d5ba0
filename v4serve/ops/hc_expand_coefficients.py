"""mHC expand of a sublayer's output fused with the next sublayer's coefficients (the streams the
expand writes go straight into the next mixer): public entry point. Math: hc_expand_reference.py,
then hc_stream_coefficients' (hc_mix_reference.py, hc_coefficients_reference.py); kernel:
hc_expand_mix_triton.py (one launch where `hc_expand` + `hc_stream_coefficients` are two, with
their bits)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.hc_coefficients import check_coefficient_args
from v4serve.ops.hc_expand import check_expand_args, hc_expand
from v4serve.ops.hc_expand_mix_triton import expand_mix_fits, hc_expand_mix_triton
from v4serve.ops.hc_mix import check_mix_args
from v4serve.ops.hc_stream_coefficients import hc_stream_coefficients


def hc_expand_coefficients(output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                           fn: torch.Tensor, rms_eps: float, base: torch.Tensor, scale: torch.Tensor, n: int,
                           iters: int, hc_eps: float, tickets: torch.Tensor | None = None, impl="auto"
                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(X' [T, n, D] in streams.dtype, pre' [T, n], post' [T, n], comb' [T, n, n] fp32):
    X' = hc_expand(output, streams, post, comb), then hc_stream_coefficients(flatten(X'), fn,
    rms_eps, base, scale, n, iters, hc_eps) of the next sublayer. `tickets`: as hc_mix's."""
    check_expand_args(output, streams, post, comb)
    check_mix_args(streams.flatten(1), fn)
    check_coefficient_args(fn.shape[0], base, n, iters)
    T, _, D = streams.shape
    if use_triton(impl, output, streams, post, comb, fn, base, scale) and expand_mix_fits(D, T):
        coefficients = dict(base=base.float().contiguous(), scale=scale.float().contiguous(), n=n, iters=iters,
                            hc_eps=hc_eps)
        return hc_expand_mix_triton(output, streams, post, comb, fn, rms_eps, coefficients, tickets)
    new_streams = hc_expand(output, streams, post, comb, impl=impl)
    return (new_streams, *hc_stream_coefficients(new_streams.flatten(1), fn, rms_eps, base, scale, n, iters, hc_eps,
                                                 tickets, impl=impl))
