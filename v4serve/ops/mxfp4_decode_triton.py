"""Triton device functions that decode a tile of packed MXFP4 bytes into scaled weights, two ways.

Input: `packed`, the bytes of a tile of weight rows (element 2j in the low nibble of byte j, 2j+1
in the high nibble), and per byte the ue8m0 scale byte b of its 32-element block. Output: two
tiles of the same shape, the scaled values of the low nibbles (the even elements) and of the high
nibbles (the odd elements). Kept apart, they feed two dots against the even and the odd columns
of the activations: no interleaving of the nibbles in registers.

The bit trick both variants use: a nibble c = s e1 e0 m placed with its sign at a float's sign bit
and its three magnitude bits at the two lowest exponent bits and the top mantissa bit is the float
e2m1(c) * 2^(1 - bias) exactly, the codes with e = 0 (0 and 0.5) landing on zero and on the
smallest subnormal power of two as they should:

    e > 0:  2^(e - bias) (1 + m/2)   = e2m1(c) * 2^(1 - bias)
    e = 0:  m/2 * 2^(1 - bias)        = e2m1(c) * 2^(1 - bias)

so one multiply by 2^(bias - 1) and one by the block scale 2^(b - 127) give the weight, both
products exact (at most two significant bits; b = 0 gives a subnormal scale, which both paths
keep: no flush to zero). Two multiplies and not one: 2^(b - 1 + bias - 127) leaves the float
range for b > 128 while every intermediate here stays exact for every b (a weight overflows to
inf only where 6 * 2^(b-127) does, b >= 253, as in the torch reference).

- `decode_bits` (any backend, the CPU interpreter too): fp32 (bias 127) built with integer ops per
  element, two fp32 multiplies, then the dot's dtype: about 6 operations per weight.
- `decode_asm` (compiled CUDA, sm_80+): inline PTX on 4 bytes at a time: `prmt` spreads two bytes
  into the halves of a 32-bit word, a mask, a multiply and a mask place one nibble of both bytes
  as a bf16 pair (bias 127: value * 2^-126), two `fma.rn.bf16x2` (with -0 addend, so signed zeros
  survive) apply 2^126 and the scale: about 2.75 operations per weight (a nibble pair is masked,
  multiplied by two powers of two at once, masked again, then scaled twice). bf16 arithmetic keeps
  subnormals (PTX has no .ftz for bf16).
"""

import triton
import triton.language as tl

# bf16 2^126 as a pair (exponent field 253), and -0.0 as a pair (the fma addend that leaves a*b).
_BF16X2_TWO_POW_126 = 0x7E807E80
BF16X2_NEG_ZERO = 0x80008000
_TWO_POW_126 = tl.constexpr(2.0**126)


# A nibble's mask and its spread: low nibble (bits 3..0) shifts 12 (sign) and 6 (magnitude), high
# nibble (bits 7..4) shifts 8 and 2, in both 16-bit halves of a word.
NIBBLE_LOW, NIBBLE_HIGH = (0x000F000F, (1 << 12) + (1 << 6)), (0x00F000F0, (1 << 8) + (1 << 2))


def nibble_pair_ptx(dst: str, src: str, nibble: tuple[int, int], *factors: str) -> str:
    """PTX: the bf16 pair of one nibble (NIBBLE_LOW / NIBBLE_HIGH) of each 16-bit half of `src`,
    times each bf16x2 register of `factors` in turn (fma with the -0 pair `nz`; scratch register
    `a`). The nibble (mask) times its spread = (1 << sign_shift) + (1 << magnitude_shift) puts a copy
    of it where its sign bit lands on bit 15 / 31 and one where its magnitude bits land on 8..6 /
    24..22 (the two copies do not overlap, so the product has no carries); the second mask keeps
    those: e2m1 * 2^-126 as bf16 (the docstring's bit trick, bias 127)."""
    mask, spread = nibble
    ptx = f"and.b32 a, {src}, {mask:#x};\nmul.lo.u32 a, a, {spread:#x};\nand.b32 a, a, 0x81C081C0;\n"
    for n, factor in enumerate(factors):
        ptx += f"fma.rn.bf16x2 {dst if n == len(factors) - 1 else 'a'}, a, {factor}, nz;\n"
    return ptx


def four_bytes_ptx(factors_01: tuple[str, ...], factors_23: tuple[str, ...], registers: str = "",
                   setup: str = "") -> str:
    """PTX of one inline-asm call over 4 packed bytes ($4): $0, $1 the low nibbles of bytes (0, 1) and
    (2, 3), $2, $3 their high nibbles, each pair times `factors_01` / `factors_23` (registers or
    operands). t01 / t23 hold bytes 0, 1 / 2, 3 in the low byte of each 16-bit half (prmt selector 4
    = a zero byte of `zero`), so each output element depends on its own byte only."""
    return ("{\n.reg .b32 t01, t23, a, nz, zero" + registers + ";\n"
            f"mov.b32 nz, {BF16X2_NEG_ZERO:#x};\nmov.b32 zero, 0;\n" + setup
            + "prmt.b32 t01, $4, zero, 0x4140;\nprmt.b32 t23, $4, zero, 0x4342;\n"
            + nibble_pair_ptx("$0", "t01", NIBBLE_LOW, *factors_01)
            + nibble_pair_ptx("$1", "t23", NIBBLE_LOW, *factors_23)
            + nibble_pair_ptx("$2", "t01", NIBBLE_HIGH, *factors_01)
            + nibble_pair_ptx("$3", "t23", NIBBLE_HIGH, *factors_23) + "}")


# $0..$3: outputs; $4: 4 packed bytes; $5, $6: their scales as two bf16 pairs, after 2^126.
_DECODE_ASM = tl.constexpr(four_bytes_ptx(("k126", "$5"), ("k126", "$6"), ", k126",
                                            f"mov.b32 k126, {_BF16X2_TWO_POW_126:#x};\n"))


@triton.jit
def ue8m0_to_bf16(b):
    """int32 lanes holding ue8m0 bytes -> bf16 2^(b - 127) (b = 0: the subnormal 2^-127)."""
    return tl.where(b == 0, 0x40, b << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def decode_bits(packed, scale):
    """packed int32 lanes (a byte each), scale fp32 2^(b-127) of the same shape -> (even, odd) fp32."""
    lo = (((packed & 0x8) << 28) | ((packed & 0x7) << 22)).to(tl.float32, bitcast=True)
    hi = (((packed & 0x80) << 24) | ((packed & 0x70) << 18)).to(tl.float32, bitcast=True)
    return lo * _TWO_POW_126 * scale, hi * _TWO_POW_126 * scale


@triton.jit
def decode_asm(packed, scale):
    """packed uint8 bytes, scale bf16 2^(b-127) of the same shape -> (even, odd) bf16.

    Per 4 bytes (one 32-bit register, byte i = element i of this call) and their 4 scales (two
    bf16x2 registers): t01 = {0, byte1, 0, byte0}, t23 = {0, byte3, 0, byte2} (prmt); the low
    nibble of each half: sign bit 3 -> 15 (shift 12), magnitude bits 2..0 -> 8..6 (shift 6); the
    high nibble: bit 7 -> 15 (shift 8), bits 6..4 -> 8..6 (shift 2); then * 2^126 * scale."""
    return tl.inline_asm_elementwise(
        asm=_DECODE_ASM,
        constraints="=r,=r,=r,=r,r,r,r",  # even {0,1}, {2,3}; odd {0,1}, {2,3}; 4 bytes; scales {0,1}, {2,3}
        args=[packed, scale],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


# ---- word decoders for the GEMV kernel (mxfp4_gemv_triton.py): one int32 word = 4 packed bytes =
# elements 0..7 (element q in nibble q), decoded to 8 fp32 values e2m1 * 2^-14 (the f16 placement:
# sign at bit 15, magnitude bits at 11..9 is e2m1 * 2^-14 exactly, codes 0 and 0.5 landing on
# zero and the subnormal 2^-15 as they should; fp32 holds it exactly). The scale is applied later,
# once per 32-element partial sum.
GEMV_UNIT_INV = tl.constexpr(2.0**14)  # the decoded values are e2m1 / GEMV_UNIT_INV
_TWO_POW_112 = tl.constexpr(2.0**112)  # fp32 bit placement (e2m1 * 2^-126) -> e2m1 * 2^-14


def _f16_pair_to_f32(dst_lo: str, dst_hi: str, src: str, selector: int) -> str:
    """PTX: two bytes of `src` (each s<<7 | magnitude<<1) into the top bytes of an f16 pair
    (prmt: selector 4 = a zero byte), widened to fp32 (exact; HADD2.F32 on sm_80+)."""
    return (f"prmt.b32 p, {src}, zero, {selector:#x};\n"
            "mov.b32 {h0, h1}, p;\n"
            f"cvt.f32.f16 {dst_lo}, h0;\n"
            f"cvt.f32.f16 {dst_hi}, h1;\n")


# $0..$7: elements 0..7; $8: the word. lo / hi hold, per byte, its low / high nibble as
# sign << 7 | magnitude << 1 (the top byte of that element's f16): 7 integer ops for 8 elements,
# then 4 prmt and 8 cvt. Bytes 0, 1 of lo are elements 0, 2; bytes 2, 3 elements 4, 6; hi: 1, 3, 5, 7.
_DECODE_WORD_F16 = tl.constexpr(
    "{\n.reg .b32 t, u, lo, hi, p, zero;\n.reg .b16 h0, h1;\n"
    "mov.b32 zero, 0;\n"
    "shl.b32 t, $8, 4;\n"
    "shl.b32 u, $8, 1;\n"
    "and.b32 u, u, 0x0E0E0E0E;\n"
    "lop3.b32 lo, t, 0x80808080, u, 0xEA;\n"  # (t & 0x80808080) | u
    "shr.u32 t, $8, 3;\n"
    "and.b32 t, t, 0x0E0E0E0E;\n"
    "lop3.b32 hi, $8, 0x80808080, t, 0xEA;\n"
    + _f16_pair_to_f32("$0", "$2", "lo", 0x1404) + _f16_pair_to_f32("$4", "$6", "lo", 0x3424)
    + _f16_pair_to_f32("$1", "$3", "hi", 0x1404) + _f16_pair_to_f32("$5", "$7", "hi", 0x3424)
    + "}"
)


@triton.jit
def decode_word_asm(words):
    """int32 words (8 packed e2m1 codes each) -> 8 fp32 tensors e2m1 * 2^-14, element q = nibble q
    (compiled CUDA: inline PTX, ~1.4 integer ops + 1 conversion a weight)."""
    return tl.inline_asm_elementwise(
        asm=_DECODE_WORD_F16,
        constraints="=r,=r,=r,=r,=r,=r,=r,=r,r",
        args=[words],
        dtype=(tl.float32,) * 8,
        is_pure=True,
        pack=1,
    )


@triton.jit
def _nibble_bits(words, q: tl.constexpr):
    """Nibble q of each word placed in an fp32 (sign bit 31, magnitude bits 24..22): e2m1 * 2^-126."""
    nib = words >> (4 * q)
    return (((nib & 0x8) << 28) | ((nib & 0x7) << 22)).to(tl.float32, bitcast=True) * _TWO_POW_112


@triton.jit
def decode_word_bits(words):
    """decode_word_asm with integer ops and an exact multiply (any backend, the interpreter too)."""
    return (_nibble_bits(words, 0), _nibble_bits(words, 1), _nibble_bits(words, 2), _nibble_bits(words, 3),
            _nibble_bits(words, 4), _nibble_bits(words, 5), _nibble_bits(words, 6), _nibble_bits(words, 7))
