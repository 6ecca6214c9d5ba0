"""Packed KV rows (v4serve/ops/kv_pack*.py): byte layout and bit-exactness against the rounding
reference `apply_kv_format` (kv_quant_reference.py), which is written independently of the packer."""

import pytest
import torch

from v4serve.formats import ROW_FORMATS, row_format
from v4serve.ops.kv_pack import pack_rows, store_rows, unpack_rows
from v4serve.ops.kv_quant import apply_kv_format

DIMS = {"fp8_e8m0_b64_rope64": 512, "fp8_e8m0_b32": 512, "fp4_e8m0_b32": 128, "fp4_e4m3_b16": 512}


def _bits(t):
    return t.view(torch.int16) if t.dtype == torch.bfloat16 else t.view(torch.int32)


def test_layouts_documented_sizes():
    f = row_format("fp8_e8m0_b64_rope64")
    assert (f.codes_bytes(512), f.tail_offset(512), f.scales_offset(512), f.payload_bytes(512), f.row_bytes(512)) \
        == (448, 448, 576, 583, 592)
    f = row_format("fp4_e8m0_b32")
    assert (f.codes_bytes(128), f.scales_offset(128), f.row_bytes(128)) == (64, 64, 68)
    assert row_format("fp8_e8m0_b32").row_bytes(512) == 528
    assert row_format("fp4_e4m3_b16").row_bytes(512) == 288
    assert row_format("bf16").row_bytes(512) == 1024
    with pytest.raises(ValueError, match="cannot hold"):
        f.row_bytes(100)


def _random_rows(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.exp2(torch.randint(-20, 20, (n, 1), generator=g).float())
    x[0] = 0.0
    x[1, ::3] = -0.0
    x[2] = torch.finfo(torch.bfloat16).tiny * torch.randn(d, generator=g)  # subnormal-scale rows
    x[3, :] = 1e-30
    x[4, 0] = 3.0e38  # +-max-scale blocks
    x[5, 5] = -3.0e38
    return x.bfloat16()


@pytest.mark.parametrize("name", sorted(DIMS))
def test_round_trip_equals_apply_kv_format(name):
    d = DIMS[name]
    x = _random_rows(64, d, 0)
    packed = pack_rows(x, name, impl="torch")
    assert packed.dtype == torch.uint8 and packed.shape == (64, row_format(name).row_bytes(d))
    f = row_format(name)
    assert not packed[:, f.payload_bytes(d):].any()  # zero padding
    out = unpack_rows(packed, name, d, torch.bfloat16, impl="torch")
    assert torch.equal(_bits(out), _bits(apply_kv_format(x, name, impl="torch")))


def test_fp32_rows_keep_quantized_bits_and_round_tail_to_bf16():
    x = torch.randn(8, 512, dtype=torch.float32)
    out = unpack_rows(pack_rows(x, "fp8_e8m0_b64_rope64"), "fp8_e8m0_b64_rope64", 512, torch.float32)
    ref = apply_kv_format(x, "fp8_e8m0_b64_rope64", impl="torch")
    assert torch.equal(_bits(out[:, :448]), _bits(ref[:, :448]))
    assert torch.equal(out[:, 448:], x[:, 448:].bfloat16().float())


def test_fp8_every_code_times_every_scale():
    """Every e4m3 code c (NaNs excluded) against every ue8m0 scale byte b: a block of 64 holding
    the code's value times 2^(b-127), with 448 * 2^(b-127) in the block so the scale is b."""
    f = row_format("fp8_e8m0_b32")
    codes = torch.arange(256, dtype=torch.int32)
    codes = codes[(codes & 0x7F) != 0x7F].to(torch.uint8)  # 0x7f / 0xff are NaN in e4m3fn
    values = codes.view(torch.float8_e4m3fn).float()
    for b in range(1, 247):  # s = 2^(b-127); 448 s must stay finite in fp32 (b <= 246)
        s = 2.0 ** (b - 127)
        if 448 * s < 1e-4:  # below the scale floor every block gets the floor's scale
            continue
        n = values.numel()
        x = torch.zeros(n, 32)
        x[:, 0] = 448 * s
        x[:, 1] = values * s
        packed = pack_rows(x, f, impl="torch")
        assert torch.equal(packed[:, 1], codes), b
        assert (packed[:, f.scales_offset(32)] == b).all(), b
        out = unpack_rows(packed, f, 32, torch.float32, impl="torch")
        assert torch.equal(_bits(out), _bits(apply_kv_format(x, f.name, impl="torch"))), b


def test_fp8_every_byte_decodes_like_the_reference():
    """Every one of the 256 x 256 (code, scale byte) pairs unpacks to decode(code) * 2^(b-127)."""
    f = row_format("fp8_e8m0_b32")
    code = torch.arange(256, dtype=torch.int32).repeat_interleave(256).to(torch.uint8)
    scale = torch.arange(256, dtype=torch.int32).repeat(256).to(torch.uint8)
    packed = torch.zeros(65536, 528, dtype=torch.uint8)
    packed[:, 0] = code
    packed[:, 512] = scale
    out = unpack_rows(packed, f, 512, torch.float32, impl="torch")[:, 0]
    expect = code.view(torch.float8_e4m3fn).double() * torch.exp2(scale.double() - 127)
    ok = (scale > 0) & (scale < 255)  # bytes 0 (2^-127) and 255 (inf) never appear in a packed row
    assert torch.equal(out[ok].double().nan_to_num(1e300), expect[ok].float().double().nan_to_num(1e300))


@pytest.mark.parametrize("name", ["fp4_e8m0_b32", "fp4_e4m3_b16"])
def test_fp4_every_code_times_every_scale(name):
    f = row_format(name)
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    values = torch.cat([grid, -grid])
    if f.scale_kind == "ue8m0":
        scales = [2.0 ** (b - 127) for b in range(1, 253)]  # 6 * 2^(b-127) finite: b <= 252
    else:
        e4m3 = torch.arange(1, 127, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
        scales = [float(s) for s in e4m3 if 6 * s >= 6 * 2.0**-9]
    for s in scales:
        x = torch.zeros(values.numel(), f.block)
        x[:, 0] = 6 * s
        x[:, 1] = values * s
        packed = pack_rows(x, f, impl="torch")
        nibble = packed[:, 0] >> 4  # element 1 is the high nibble of byte 0
        expect = torch.tensor([i for i in range(8)] + [8 + i for i in range(8)], dtype=torch.uint8)
        assert torch.equal(nibble, expect), s
        out = unpack_rows(packed, f, f.block, torch.float32, impl="torch")
        assert torch.equal(_bits(out), _bits(apply_kv_format(x, name, impl="torch"))), s


def test_store_rows_writes_the_named_rows_and_skips_negative():
    f = row_format("fp8_e8m0_b64_rope64")
    pool = torch.full((6, 592), 7, dtype=torch.uint8)
    x = _random_rows(8, 512, 1)[:3]
    store_rows(pool, torch.tensor([4, -1, 1]), x, f, impl="torch")
    packed = pack_rows(x, f, impl="torch")
    assert torch.equal(pool[4], packed[0]) and torch.equal(pool[1], packed[2])
    assert (pool[[0, 2, 3, 5]] == 7).all()


@pytest.mark.parametrize("rows", [[-1, 0, 3], [2, 0, -1, -1], [-1, -1], [], [5, 1, 0, 4]])
@pytest.mark.parametrize("name", ["fp8_e8m0_b64_rope64", "fp4_e8m0_b32"])
def test_store_rows_reference_skips_negative_rows_without_a_host_sync(rows, name):
    """The torch store runs inside the captured decode step (kernels="torch"): no mask indexing,
    no host sync (capture_guard.py), and still exactly the kept rows written, whatever the
    negative rows' places (first, last, all, none) and with row 0 among the kept rows."""
    from capture_guard import NoCaptureBreakingOps
    from v4serve.ops.kv_pack_reference import store_rows_reference

    f = row_format(name)
    dim = DIMS[name]
    pool = torch.full((6, f.row_bytes(dim) + 16), 7, dtype=torch.uint8)
    x = _random_rows(8, dim, 3)[:len(rows)]
    row_ids = torch.tensor(rows, dtype=torch.int64)
    with NoCaptureBreakingOps():
        store_rows_reference(pool, row_ids, x, f)
    expect = torch.full_like(pool, 7)
    for i, r in enumerate(rows):
        if r >= 0:
            expect[r, :f.row_bytes(dim)] = pack_rows(x[i:i + 1], f, impl="torch")[0]
    assert torch.equal(pool, expect)


def test_fp4_unpack_reads_no_host_data():
    """unpack of fp4 rows builds no tensor from a host list (a pageable copy under capture)."""
    from capture_guard import NoCaptureBreakingOps
    from v4serve.ops.kv_pack_reference import E2M1_GRID, e2m1_values

    codes = torch.arange(16, dtype=torch.uint8)
    with NoCaptureBreakingOps():
        values = e2m1_values(codes)
    grid = torch.tensor(E2M1_GRID)
    assert torch.equal(values.view(torch.int32), torch.cat([grid, -grid]).view(torch.int32))  # -0.0 kept


def test_errors_name_the_bad_field():
    with pytest.raises(ValueError, match="not a packed format"):
        pack_rows(torch.zeros(1, 8), "bf16")
    with pytest.raises(ValueError, match="pool must be uint8"):
        store_rows(torch.zeros(2, 592), torch.tensor([0]), torch.zeros(1, 512), "fp8_e8m0_b64_rope64")
    assert set(DIMS) == {n for n, f in ROW_FORMATS.items() if f.packed}


def test_fp4_e4m3_unpack_kernel_every_code_times_every_scale():
    """The fp4_e4m3_b16 unpack kernel (interpreted here) against the reference decode, on rows
    holding every e2m1 code (both nibbles) under every finite e4m3 scale byte, and on packed rows."""
    from v4serve.ops.kv_pack_reference import e2m1_values

    f = row_format("fp4_e4m3_b16")
    scale_codes = torch.arange(256, dtype=torch.int32)
    scale_codes = scale_codes[(scale_codes & 0x7F) != 0x7F].to(torch.uint8)  # no NaN scales
    n = scale_codes.numel()
    rows = torch.zeros(n, f.row_bytes(32), dtype=torch.uint8)
    nibbles = torch.arange(16, dtype=torch.uint8)
    rows[:, :8] = nibbles[0::2] | (nibbles[1::2] << 4)  # block 0: codes 0..15, low nibble first
    rows[:, 8:16] = nibbles.flip(0)[0::2] | (nibbles.flip(0)[1::2] << 4)  # block 1: 15..0
    rows[:, 16] = scale_codes
    rows[:, 17] = scale_codes.flip(0)
    got = unpack_rows(rows, f, 32, torch.float32, impl="triton")
    scales = torch.stack((scale_codes, scale_codes.flip(0)), 1).view(torch.float8_e4m3fn).float()
    want = torch.cat((e2m1_values(nibbles), e2m1_values(nibbles.flip(0)))).view(1, 2, 16) * scales[:, :, None]
    assert torch.equal(_bits(got), _bits(want.view(n, 32)))
    x = _random_rows(20, 512, 4)
    packed = pack_rows(x, f, impl="torch")
    assert torch.equal(_bits(unpack_rows(packed, f, 512, torch.bfloat16, impl="triton")),
                       _bits(unpack_rows(packed, f, 512, torch.bfloat16, impl="torch")))


def test_fp4_e4m3_pack_and_store_kernels_write_the_reference_bytes():
    """The fp4_e4m3_b16 pack / store kernels (interpreted here) against the torch packer: rows with
    zeros, signed zeros, tiny and huge-scale blocks, the e2m1 ties (x / s on 0.25, 0.75, ..., 5) and
    bf16 and fp32 inputs; a store skips negative rows and leaves other rows' bytes alone."""
    f = row_format("fp4_e4m3_b16")
    x = _random_rows(40, 512, 9).float()
    x[6, :16] = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -1.75, -2.5, -3.5, -5.0,
                              -6.0])  # scale 1: every tie of the grid
    x[7] = x[7].clamp(-2000, 2000)
    x = x.clamp(-2000, 2000)  # amax / 6 stays on e4m3's range (the reference stores NaN past it)
    for values in (x, x.bfloat16()):
        assert torch.equal(pack_rows(values, f, impl="triton"), pack_rows(values, f, impl="torch"))
    pool = torch.full((50, f.row_bytes(512)), 0xAB, dtype=torch.uint8)
    rows = torch.randperm(50)[:40]
    rows[3] = -1
    store_rows(pool, rows, x.bfloat16(), f, impl="triton")
    want = torch.full_like(pool, 0xAB)
    keep = rows >= 0
    want[rows[keep]] = pack_rows(x.bfloat16()[keep], f, impl="torch")
    assert torch.equal(pool, want)
