"""V4.1 row formats against the golden tables of DeepSeek's reference quantizers (bit-exact):
dequantized values, scale bytes and code bytes / nibbles of every table row."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from v4serve.ops.kv_quant import apply_kv_format
from v4serve.ops.kv_quant_reference import (
    E2M1_MAX, E4M3_MAX, FP4_E4M3_SCALE_FLOOR, FP4_UE8M0_SCALE_FLOOR, FP8_SCALE_FLOOR, round_e2m1, round_e4m3,
    ue8m0_scale,
)

TABLES = load_file(str(Path(__file__).parents[1] / "data" / "v41-golden" / "formats.safetensors"))
FORMATS = {"fp8_e8m0_b32": 32, "fp4_e8m0_b32": 32, "fp4_e4m3_b16": 16}
E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _bits(t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.uint8)


@pytest.mark.parametrize("name", FORMATS)
def test_round_trip_matches_golden_dequant(name):
    x, want = TABLES[f"{name}.input"], TABLES[f"{name}.dequant"]
    got = apply_kv_format(x, name, impl="torch")
    assert torch.equal(_bits(got), _bits(want)), (got != want).nonzero()[:5]


def _scales(name, x):
    block = FORMATS[name]
    amax = x.float().reshape(x.shape[0], -1, block).abs().amax(-1)
    if name == "fp8_e8m0_b32":
        return ue8m0_scale(amax, E4M3_MAX, FP8_SCALE_FLOOR)
    if name == "fp4_e8m0_b32":
        return ue8m0_scale(amax, E2M1_MAX, FP4_UE8M0_SCALE_FLOOR)
    return round_e4m3(amax.clamp(min=FP4_E4M3_SCALE_FLOOR) / E2M1_MAX)


@pytest.mark.parametrize("name", FORMATS)
def test_scale_bytes_match_golden(name):
    x = TABLES[f"{name}.input"]
    s = _scales(name, x)
    assert torch.equal(s, TABLES[f"{name}.scales_f32"])
    if name == "fp4_e4m3_b16":
        raw = s.to(torch.float8_e4m3fn).view(torch.uint8)
    else:  # ue8m0 byte = biased exponent
        raw = ((s.view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    assert torch.equal(raw, TABLES[f"{name}.scales"])


@pytest.mark.parametrize("name", FORMATS)
def test_code_bytes_match_golden(name):
    x = TABLES[f"{name}.input"].float()
    block = FORMATS[name]
    s = _scales(name, x).repeat_interleave(block, dim=1)
    if name == "fp8_e8m0_b32":
        codes = (x / s).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
        assert torch.equal(codes, TABLES[f"{name}.codes"])
        return
    v = round_e2m1((x / s).clamp(-E2M1_MAX, E2M1_MAX))
    magnitude = (v.abs()[..., None] == E2M1_GRID).int().argmax(-1)
    nibbles = (magnitude | (torch.signbit(v).int() << 3)).to(torch.uint8)
    assert torch.equal(nibbles, TABLES[f"{name}.nibbles"])
    packed = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)  # even element in the low nibble
    assert torch.equal(packed, TABLES[f"{name}.codes"])


@pytest.mark.parametrize("name", FORMATS)
def test_packed_rows_hold_the_golden_bytes(name):
    """v4serve's packed row layout (ops/kv_pack.py): codes then scales, as the reference stores them."""
    from v4serve.formats import row_format
    from v4serve.ops.kv_pack import pack_rows, unpack_rows

    fmt, x = row_format(name), TABLES[f"{name}.input"]
    dim = x.shape[1]
    packed = pack_rows(x, fmt, impl="torch")
    codes = packed[:, fmt.codes_offset(dim):fmt.codes_offset(dim) + fmt.codes_bytes(dim)]
    scales = packed[:, fmt.scales_offset(dim):fmt.scales_offset(dim) + fmt.n_scales(dim)]
    assert torch.equal(codes, TABLES[f"{name}.codes"])
    assert torch.equal(scales, TABLES[f"{name}.scales"])
    assert torch.equal(_bits(unpack_rows(packed, fmt, dim, torch.bfloat16, impl="torch")), _bits(TABLES[f"{name}.dequant"]))
