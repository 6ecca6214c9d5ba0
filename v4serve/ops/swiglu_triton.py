"""Triton kernel of the clamped SwiGLU (math: swiglu_reference.py).

    h = round(round(silu(round(min(gate, L)))) * round(clamp(up, -L, L)))

fp32 math rounded to the inputs' dtype where the torch reference rounds (the clamped values, the
silu, the product), so bf16 results match it bit for bit up to the exp's last ulp. One launch
replaces the two clamps, the silu, the product and the cast.

Layouts: gate, up [M, I] (row strides `stride_g`, `stride_u`, unit along I; the halves of a fused
[M, 2I] gate_up are fine); h [M, I] contiguous. Grid (M, cdiv(I, BLOCK_I)).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

SWIGLU_CONFIG = dict(BLOCK_I=1024, num_warps=4)


@triton.jit
def clamped_swiglu_f32(g, u, limit, dtype: tl.constexpr):
    """The clamped SwiGLU of fp32 gate and up values (already in `dtype`'s grid) -> h in `dtype`,
    rounded where the torch reference rounds. Shared with the MXFP4 gate_up kernel's epilogue."""
    g = tl.minimum(g, limit).to(dtype).to(tl.float32)
    u = tl.minimum(tl.maximum(u, -limit), limit).to(dtype).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32)
    return (s * u).to(dtype)


@triton.jit
def _clamped_swiglu_kernel(
    gate_ptr, up_ptr, h_ptr, I, stride_g, stride_u, limit,
    BLOCK_I: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    m = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    ok = i < I
    g = tl.load(gate_ptr + m * stride_g + i, mask=ok, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + m * stride_u + i, mask=ok, other=0.0).to(tl.float32)
    tl.store(h_ptr + m * I + i, clamped_swiglu_f32(g, u, limit, h_ptr.dtype.element_ty), mask=ok)


def clamped_swiglu_triton(gate: torch.Tensor, up: torch.Tensor, limit: float) -> torch.Tensor:
    M, I = gate.shape
    gate = gate if gate.stride(1) == 1 else gate.contiguous()
    up = up if up.stride(1) == 1 else up.contiguous()
    h = torch.empty(M, I, dtype=gate.dtype, device=gate.device)
    if M == 0:
        return h
    cfg = SWIGLU_CONFIG
    _clamped_swiglu_kernel[(M, triton.cdiv(I, cfg["BLOCK_I"]))](
        gate, up, h, I, gate.stride(0), up.stride(0), float(limit), **cfg, **pdl_launch(gate),
    )
    return h
