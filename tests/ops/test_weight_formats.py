"""Weight codecs (v4serve/ops/weight_formats.py) against the formulas written out independently:
every e2m1 code x every ue8m0 scale, e4m3 block dequantization with partial edge blocks, and the
quantizers' round trips."""

import math

import pytest
import torch

from v4serve.ops import weight_formats as wf

# The OCP e2m1 table as the spec writes it (bit 3 sign, bits 0-2 magnitude code).
_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def _e2m1_value(code: int) -> float:
    return (-1.0 if code & 8 else 1.0) * _E2M1[code & 7]


def test_every_e2m1_code_times_every_ue8m0_scale_decodes_exactly():
    # Every byte (two codes) against every scale byte but NaN (255): one row per scale.
    packed = torch.arange(256, dtype=torch.int32).to(torch.uint8).repeat(255, 1)  # [255, 256] -> K = 512
    scale = torch.arange(255, dtype=torch.int32).to(torch.uint8)[:, None].expand(255, 16).contiguous()
    got = wf.dequantize_mxfp4(packed, scale)
    got_bf16 = wf.dequantize_mxfp4(packed, scale, torch.bfloat16)
    want = torch.empty(255, 512, dtype=torch.float64)
    for b in range(255):
        for byte in range(256):
            for half, code in enumerate((byte & 0xF, byte >> 4)):
                want[b, 2 * byte + half] = math.ldexp(_e2m1_value(code), b - 127)
    want32 = want.float()  # exact where representable, +-inf past fp32's range (only b >= 253)
    assert torch.equal(got, want32)
    assert torch.equal(got_bf16.float(), want.to(torch.bfloat16).float())
    finite = want32.isfinite()
    assert torch.equal(want32[finite].double(), want[finite])  # the decoded values are exact
    assert torch.equal(got_bf16.float()[finite & (want.abs() < 2.0**127)], want32[finite & (want.abs() < 2.0**127)])


def test_ue8m0_decode_and_encode():
    b = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    s = wf.decode_ue8m0(b)
    assert torch.isnan(s[255])
    assert [float(v) for v in s[:255]] == [math.ldexp(1.0, i - 127) for i in range(255)]
    assert torch.equal(wf.encode_ue8m0(s[:255]), b[:255])
    with pytest.raises(ValueError, match="powers of two"):
        wf.encode_ue8m0(torch.tensor([3.0]))


def test_e2m1_encode_rounds_to_nearest_with_ties_to_even_and_packs_low_nibble_first():
    values = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25, -0.0, 0.3, -5.1])
    want = [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0, -0.0, 0.5, -6.0]
    packed = wf.encode_e2m1(values)
    assert packed.shape == (6,)
    assert wf.decode_e2m1(packed).tolist() == want
    assert int(packed[0]) == (0 | (2 << 4))  # 0.25 -> code 0 (low), 0.75 -> code 2 (high)
    every = torch.tensor([_e2m1_value(c) for c in range(16)])
    assert torch.equal(wf.encode_e2m1(every), torch.tensor([c | ((c + 1) << 4) for c in range(0, 16, 2)],
                                                           dtype=torch.uint8))


def _naive_fp8_dequant(weight, scale, block):
    n, k = weight.shape
    out = torch.empty(n, k, dtype=torch.float64)
    wv = weight.float().tolist()
    for i in range(n):
        for j in range(k):
            out[i, j] = wv[i][j] * float(scale[i // block[0], j // block[1]])
    return out


@pytest.mark.parametrize("n, k, block", [(20, 36, (8, 16)), (128, 128, (128, 128)), (33, 70, (32, 32))])
@pytest.mark.parametrize("scale_fmt", ["ue8m0", "fp32"])
def test_fp8_blocks_round_trip_with_partial_edge_blocks(n, k, block, scale_fmt):
    gen = torch.Generator().manual_seed(n * k)
    w = torch.randn(n, k, generator=gen) * torch.logspace(-3, 2, n)[:, None]
    q, s = wf.quantize_fp8_blocks(w, block, scale_fmt)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (-(-n // block[0]), -(-k // block[1]))
    if scale_fmt == "ue8m0":
        assert torch.equal(torch.exp2(torch.log2(s).round()), s)
    deq = wf.dequantize_fp8_blocks(q, s, block)
    assert torch.equal(deq.double(), _naive_fp8_dequant(q, s, block).float().double())
    # e4m3 keeps 3 mantissa bits: |w - deq| <= 2^-4 |w| for normal codes, plus the subnormal step.
    step = s.repeat_interleave(block[0], 0)[:n].repeat_interleave(block[1], 1)[:, :k] * 2.0**-9
    assert torch.all((w - deq).abs() <= w.abs() * 2.0**-4 + step)


def test_fp8_scale_shape_errors_name_the_field():
    q, s = wf.quantize_fp8_blocks(torch.randn(20, 36), (8, 16))
    with pytest.raises(ValueError, match=r"scale must be float32 \[3, 3\]"):
        wf.dequantize_fp8_blocks(q, s[:2], (8, 16))
    with pytest.raises(ValueError, match="weight must be float8_e4m3fn"):
        wf.dequantize_fp8_blocks(q.float(), s, (8, 16))


def test_mxfp4_quantize_round_trip():
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(3, 10, 96, generator=gen) * 0.02
    packed, scale = wf.quantize_mxfp4(w)
    assert packed.shape == (3, 10, 48) and scale.shape == (3, 10, 3) and scale.dtype == torch.uint8
    deq = wf.dequantize_mxfp4(packed, scale)
    s = wf.decode_ue8m0(scale).repeat_interleave(32, -1)
    # at most half an e2m1 step: .25 s below 2 s, .5 s up to 4 s, s between 4 s and 6 s
    err = (w - deq).abs()
    assert torch.all(err <= torch.where(w.abs() <= 2 * s, 0.25 * s, torch.where(w.abs() <= 4 * s, 0.5 * s, s)))
    assert torch.all(deq.abs() <= 6 * s)
    with pytest.raises(ValueError, match=r"scale must be \[\.\.\., N, K/32\]"):
        wf.dequantize_mxfp4(packed, scale[..., :2])
