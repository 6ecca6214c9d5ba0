"""Triton device functions that decode the weight formats in registers (layouts in weight_formats.py).

All take int32 lanes holding the raw bits and return float32, using integer ops and bitcasts only:
exact on every architecture (sm_80 has no fp8 conversions) and in the CPU interpreter.

    e4m3 byte  b = s eeee mmm:  e > 0: (-1)^s 2^(e-7) (1 + m/8)  -> fp32 bits s<<31 | (e+120)<<23 | m<<20
                                e = 0: (-1)^s m 2^-9
    e2m1 code  c = s mmm (mag code 0..7 -> 0, .5, 1, 1.5, 2, 3, 4, 6): code >= 2 -> exponent (c>>1) - 1,
                                mantissa bit c & 1 -> fp32 bits (126 + (c>>1))<<23 | (c&1)<<22; c = 1 -> 0.5
    ue8m0 byte b: 2^(b-127) -> fp32 bits b<<23 (b >= 1), 0x00400000 (b = 0)
"""

import triton
import triton.language as tl


@triton.jit
def e4m3_bits_to_f32(b):
    e = (b >> 3) & 0xF
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    mag = tl.where(e > 0, normal, m.to(tl.float32) * 0.001953125)
    # the sign as a bit (Triton's unary minus is 0 - x, which would turn -0 into +0)
    return (mag.to(tl.int32, bitcast=True) | ((b & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def e2m1_to_f32(code):
    c = code & 7
    bits = tl.where(c >= 2, ((126 + (c >> 1)) << 23) | ((c & 1) << 22), tl.where(c == 1, 126 << 23, 0))
    return (bits | ((code & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def ue8m0_to_f32(b):
    return tl.where(b == 0, 0x00400000, b << 23).to(tl.float32, bitcast=True)
