"""Triton device function: fp4_e8m0_b32 rows, read as int32 words, decoded to bf16 in registers.

Row layout (v4serve/formats.py), Dk channels (a multiple of 32), NW = Dk / 8 code words, then
Dk / 128 scale words (one for Dk = 128: 17 words = 68 bytes per row):

    word i < NW     channels 8i .. 8i + 7, channel 8i + j in bits [4j, 4j + 4) (the low nibble of
                    byte k is channel 2k; words are little-endian). A nibble is e2m1: bit 3 the sign,
                    bits 0-2 the magnitude index m of (0, 0.5, 1, 1.5, 2, 3, 4, 6)
    word NW + g/4   byte g % 4 = the ue8m0 scale b of channels [32g, 32g + 32): 2^(b - 127)

Decoding, exactly (every value is an e2m1 value times a power of two, so every step below is an
exact bf16 operation; no rounding anywhere):

1. Channels j and j + 4 of a word sit 16 bits apart, so one shift and one mask per nibble pair
   place both magnitudes at bits [6, 9) and both signs at bit 15 of the two 16-bit halves
   (four pairs per word, 15 integer operations for 8 channels). Each half is then the bf16 whose
   exponent bits 8-7 and top mantissa bit 6 are the three magnitude bits: for m >= 2 the bf16 value
   is e2m1(m) * 2^-126 (a normal number), for m = 1 the bf16 subnormal 2^-127 = 0.5 * 2^-126,
   for m = 0 zero. Sign included: the half is e2m1(nibble) * 2^-126, for every nibble.
2. Each 16-bit half is read as a bf16 (the pair word is a bf16x2 register as built).
3. Times 2^126 (exact: the result is normal; bf16 multiplies keep subnormal inputs) and times
   2^(b - 127) (exact: a 2-bit-significand value times a power of two, down to 0.5 * 2^-126, a
   bf16 subnormal), in packed bf16x2 multiplies, two channels per instruction. Scale byte 0 reads as
   0, as in the torch reference (kv_pack_reference.py).

Column order: the decoded tile holds channel 8i + j + 4 half in column 8i + 2j + half (i the word,
j < 4, half = which 16-bit half of the pair word), so that every bf16x2 register of the tile is one
pair word as built (packing channels 8i + j and 8i + j + 1 together would cost a byte permute per
register). A dot over channels is the same sum in any column order: the other operand's rows are
put in the same order once (`to_pair_order`).
"""

import triton
import triton.language as tl

_MAG_BITS = tl.constexpr(0x01C001C0)  # bits 6-8 of both 16-bit halves
_SIGN_BITS = tl.constexpr(0x80008000 - (1 << 32))  # bit 15 of both halves (as an int32)
_TWO_POW_126_BITS = tl.constexpr(253 << 7)  # bf16 2^126 (biased exponent 253)


@triton.jit
def _scale_pow2(b):
    """bf16 2^(b - 127) of ue8m0 bytes b (int32 0..255): b is the biased exponent field. As in the
    torch reference, byte 0 reads as zero (the packer never writes it: its floor is 2^-126) and 255
    as infinity."""
    return (b << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _channel_values(pairs, scale):
    """The two bf16 halves of int32 `pairs` (each e2m1 * 2^-126) times 2^126 * scale: the channels'
    values, exactly (bf16 multiplies, packed two to an instruction): (low half, high half)."""
    two_pow_126 = tl.full(pairs.shape, _TWO_POW_126_BITS, tl.int16).to(tl.bfloat16, bitcast=True)
    lo = pairs.to(tl.int16).to(tl.bfloat16, bitcast=True) * two_pow_126 * scale
    hi = (pairs >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True) * two_pow_126 * scale
    return lo, hi


@triton.jit
def decode_fp4_words(words, scale_words, BLOCK_D: tl.constexpr):
    """bf16 [R, BLOCK_D] of fp4_e8m0_b32 rows: `words` int32 [R, BLOCK_D // 8] (the code words),
    `scale_words` int32 [R, BLOCK_D // 8]: for code word i, the scale word NW + i // 16 (the same
    word broadcast to every i of it)."""
    NW: tl.constexpr = BLOCK_D // 8
    wi = tl.arange(0, NW)
    scale = _scale_pow2((scale_words >> (8 * ((wi // 4) % 4))[None, :]) & 0xFF)  # group i // 4 of word i
    # pairs (j, j + 4): magnitude bits of channel j from bits 4j..4j+2 to 6..8, sign bit 4j+3 to 15
    p0 = ((words << 6) & _MAG_BITS) | ((words << 12) & _SIGN_BITS)
    p1 = ((words << 2) & _MAG_BITS) | ((words << 8) & _SIGN_BITS)
    p2 = ((words >> 2) & _MAG_BITS) | ((words << 4) & _SIGN_BITS)
    p3 = ((words >> 6) & _MAG_BITS) | (words & _SIGN_BITS)
    c0, c4 = _channel_values(p0, scale)
    c1, c5 = _channel_values(p1, scale)
    c2, c6 = _channel_values(p2, scale)
    c3, c7 = _channel_values(p3, scale)
    # [R, NW, j_hi, j_lo, half]: column 8i + 2j + half holds channel 8i + j + 4 half (PAIR_ORDER),
    # so that each bf16x2 register of the tile is one `pairs` word: no repacking
    lows = tl.join(tl.join(c0, c2), tl.join(c1, c3))
    highs = tl.join(tl.join(c4, c6), tl.join(c5, c7))
    return tl.reshape(tl.join(lows, highs), (words.shape[0], BLOCK_D))


@triton.jit
def to_pair_order(x, BLOCK_D: tl.constexpr):
    """[BLOCK_D, N] rows in channel order -> rows in the column order of decode_fp4_words
    (row 8i + 2j + half = channel 8i + j + 4 half): the other operand of a dot with decoded keys."""
    N: tl.constexpr = x.shape[1]
    x = tl.reshape(x, (BLOCK_D // 8, 2, 4, N))  # (i, half, j, n)
    return tl.reshape(tl.permute(x, (0, 2, 1, 3)), (BLOCK_D, N))
