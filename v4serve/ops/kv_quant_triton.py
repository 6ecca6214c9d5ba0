"""Triton kernel of the block-scaled round trips with a ue8m0 scale (math: kv_quant_reference.py).

    s = 2^ceil(log2(max(amax, FLOOR) / QMAX))         per group of BLOCK channels of one row
    v = round(clamp(x / s, -QMAX, QMAX)) * s           channels [0, N_QUANT); the rest copied

Layouts: x, out [rows, D], last dim contiguous. Grid (cdiv(rows, BLOCK_ROWS), cdiv(D, BLOCK)):
a program owns one channel group of BLOCK_ROWS rows. Rounding is done on the fp32 bits, so the
result is bit-exact to the reference on the GPU and in the interpreter alike (whose fp8 casts
truncate): the quantum 2^(max(e, MIN_EXP) - MANT_BITS) of |y| is applied with the 2^23
add-subtract trick, which rounds to nearest even. e4m3: MANT_BITS 3, MIN_EXP -6;
e2m1: MANT_BITS 1, MIN_EXP 0.
"""

import torch
import triton
import triton.language as tl

BLOCK_ROWS = 16
NUM_WARPS = 4


@triton.jit
def _pow2(e):
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _round_to_grid(y, MANT_BITS: tl.constexpr, MIN_EXP: tl.constexpr):
    bits = y.to(tl.int32, bitcast=True)
    mag_bits = bits & 0x7FFFFFFF
    exponent = ((mag_bits >> 23) & 0xFF) - 127
    quantum_exp = tl.maximum(exponent, MIN_EXP) - MANT_BITS
    steps = mag_bits.to(tl.float32, bitcast=True) * _pow2(-quantum_exp)
    steps = (steps + 8388608.0) - 8388608.0
    rounded = (steps * _pow2(quantum_exp)).to(tl.int32, bitcast=True)
    return (rounded | ((bits >> 31) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def _ue8m0_round_trip_kernel(
    x_ptr, out_ptr, n_rows, D, N_QUANT,
    stride_x, stride_o,
    QMAX: tl.constexpr, FLOOR: tl.constexpr, MANT_BITS: tl.constexpr, MIN_EXP: tl.constexpr,
    BLOCK: tl.constexpr, BLOCK_ROWS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    group_start = tl.program_id(1) * BLOCK
    cols = group_start + tl.arange(0, BLOCK)
    ok = (rows < n_rows)[:, None] & (cols < D)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :], mask=ok, other=0.0)
    out_ptrs = out_ptr + rows.to(tl.int64)[:, None] * stride_o + cols[None, :]
    if group_start < N_QUANT:
        xf = x.to(tl.float32)
        ratio = tl.math.div_rn(tl.maximum(tl.max(tl.abs(xf), 1), FLOOR), QMAX)
        ratio_bits = ratio.to(tl.int32, bitcast=True)
        exponent = ((ratio_bits >> 23) & 0xFF) - 127 + ((ratio_bits & 0x7FFFFF) != 0).to(tl.int32)
        y = tl.minimum(tl.maximum(xf * _pow2(-exponent)[:, None], -QMAX), QMAX)
        value = _round_to_grid(y, MANT_BITS, MIN_EXP) * _pow2(exponent)[:, None]
        tl.store(out_ptrs, value.to(out_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(out_ptrs, x, mask=ok)


def ue8m0_round_trip_triton(x: torch.Tensor, block: int, n_quant: int, fp4: bool) -> torch.Tensor:
    """fp8 e4m3 (fp4=False) or fp4 e2m1 (fp4=True) round trip of channels [0, n_quant), per `block`."""
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out.reshape(x.shape)
    params = dict(QMAX=6.0, FLOOR=6.0 * 2.0**-126, MANT_BITS=1, MIN_EXP=0) if fp4 else \
        dict(QMAX=448.0, FLOOR=1e-4, MANT_BITS=3, MIN_EXP=-6)
    grid = (triton.cdiv(x2.shape[0], BLOCK_ROWS), triton.cdiv(D, block))
    _ue8m0_round_trip_kernel[grid](
        x2, out, x2.shape[0], D, n_quant, x2.stride(0), out.stride(0),
        BLOCK=block, BLOCK_ROWS=BLOCK_ROWS, num_warps=NUM_WARPS, **params,
    )
    return out.reshape(x.shape)
