"""mHC head's collapse weights straight from the final streams (the mixer input and the head's
sigmoid as one op): public entry point. Math: hc_head_pre_reference.py; kernel: hc_mix_triton.py's
mixer with its HEAD_PRE epilogue (hc_head_pre_triton.py): one launch where the mixer and five torch
elementwise launches were."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.hc_head_pre_reference import hc_head_pre_reference
from v4serve.ops.hc_mix import check_mix_args
from v4serve.ops.hc_mix_triton import hc_mix_triton


def hc_head_pre(x: torch.Tensor, fn: torch.Tensor, rms_eps: float, base: torch.Tensor, scale: torch.Tensor,
                hc_eps: float, tickets: torch.Tensor | None = None, impl="auto") -> torch.Tensor:
    """pre [T, n] fp32 of the flattened final streams x [T, n D] (any float dtype) for the head's
    fn [n, n D], base [n], scale [1] fp32. `tickets`: as hc_mix's."""
    check_mix_args(x, fn)
    n = fn.shape[0]
    if base.shape != (n,) or scale.numel() != 1 or n & (n - 1):
        raise ValueError(f"the head needs base [{n}] and scale [1] with n a power of two, got base "
                         f"{tuple(base.shape)} and scale {tuple(scale.shape)}")
    if use_triton(impl, x, fn, base, scale):
        head = dict(base=base.float().contiguous(), scale=scale.float().contiguous(), hc_eps=hc_eps)
        return hc_mix_triton(x, fn.float(), rms_eps, tickets, head=head)[2]
    return hc_head_pre_reference(x, fn, rms_eps, base, scale, hc_eps)
