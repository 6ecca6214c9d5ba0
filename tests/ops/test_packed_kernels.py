"""Triton kernels over packed KV rows (CPU: TRITON_INTERPRET=1) against the same kernels over the
unpacked bf16 rows (bit-identical: dequantization is exact and the math after it is the same; the
indexer within fp32 summation order: it sums channels in another order), and the packing kernels
against the torch reference bytes."""

import pytest
import torch
from cases import PACKED_B8_VARIANTS, rel_err, sparse_attn_inputs

from v4serve.ops.compress_decode import compress_decode
from v4serve.ops.kv_pack import pack_rows, store_rows, unpack_rows
from v4serve.ops.norm_rope import rms_norm_rope
from v4serve.ops.sparse_attn import sparse_attn_paged
from v4serve.ops.sparse_attn_triton import (
    DECODE_CONFIG_SMALL, DECODE_CONFIG_SMALL_PACKED, DECODE_CONFIG_TWO_PASS, DECODE_CONFIG_TWO_PASS_PACKED,
    PREFILL_CONFIG_H32, PREFILL_CONFIG_PACKED)

FORMATS = [("fp8_e8m0_b64_rope64", 512), ("fp8_e8m0_b64_rope64", 128), ("fp8_e8m0_b32", 96), ("fp4_e8m0_b32", 128)]


def _rows(n, d, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.exp2(torch.randint(-30, 30, (n, 1), generator=g).float())
    x[0] = 0.0
    x[1, ::2] = -0.0
    x[2] *= 1e-35
    x[3, 7] = 3e38
    return x.bfloat16()


@pytest.mark.parametrize("name,d", FORMATS)
def test_pack_and_store_kernels_write_the_reference_bytes(name, d):
    x = _rows(24, d, d)
    ref = pack_rows(x, name, impl="torch")
    assert torch.equal(pack_rows(x, name, impl="triton"), ref)
    pool = torch.full((30, ref.shape[1]), 0xAB, dtype=torch.uint8)
    rows = torch.randperm(30)[:24]
    rows[5] = -1
    store_rows(pool, rows, x, name, impl="triton")
    keep = rows >= 0
    assert torch.equal(pool[rows[keep]], ref[keep])


@pytest.mark.parametrize("name,d", [f for f in FORMATS if f[0].startswith("fp8")])
def test_unpack_kernel_is_bit_exact(name, d):
    packed = pack_rows(_rows(40, d, 1), name, impl="torch")
    for dtype in (torch.bfloat16, torch.float32):
        out = unpack_rows(packed, name, d, dtype, impl="triton")
        assert torch.equal(out, unpack_rows(packed, name, d, dtype, impl="torch"))


def _packed_inputs(B, M, H, D, n_window, K, fmt, seed):
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(B, M, H, D, n_window, K, seed=seed)
    rb = -(-pack_rows(win[:1], fmt).shape[1] // 16) * 16
    buf = torch.zeros(3 + win.shape[0] + cmp.shape[0], rb, dtype=torch.uint8)  # pools are views into one buffer
    pw, pc = buf[3 : 3 + win.shape[0]], buf[3 + win.shape[0] :]
    pw.copy_(pack_rows(win, fmt))
    pc.copy_(pack_rows(cmp, fmt))
    return q, pw, pc, idx, sink, counts


CONFIGS = {
    "prefill": (2, 3, 16, PREFILL_CONFIG_H32),
    "prefill sliced": (2, 3, 16, dict(PREFILL_CONFIG_PACKED, QK_SLICE=64)),  # two slices at D 128
    "prefill packed tiles": (2, 3, 16, PREFILL_CONFIG_PACKED),  # production: QK_SLICE 128 (2 blocks a slice)
    "split-k decode": (2, 1, 16, DECODE_CONFIG_SMALL),
    "split-k decode sliced": (2, 1, 16, dict(DECODE_CONFIG_SMALL_PACKED, QK_SLICE=64)),
    "split-k decode packed tiles": (2, 1, 16, DECODE_CONFIG_SMALL_PACKED),
    "two-pass decode": (3, 1, 64, DECODE_CONFIG_TWO_PASS),
}


@pytest.mark.parametrize("kind", list(CONFIGS))
@pytest.mark.parametrize("fmt,D", [("fp8_e8m0_b64_rope64", 128), ("fp8_e8m0_b32", 64)])
def test_attention_over_packed_rows_equals_the_bf16_kernel_over_unpacked(kind, fmt, D):
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    B, M, H, cfg = CONFIGS[kind]
    q, pw, pc, idx, sink, counts = _packed_inputs(B, M, H, D, 40, 70, fmt, seed=len(kind))
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    out = sparse_attn_paged_triton(q, pw, pc, idx, 40, sink, 0.1, counts, tile_config=dict(cfg),
                                   row_format=__import__("v4serve.formats").formats.row_format(fmt))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, 40, sink, 0.1, counts, tile_config=dict(cfg))
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    # and the public entry point's reference agrees within bf16 rounding
    torch_ref = sparse_attn_paged(q, pw, pc, idx, 40, sink, 0.1, counts, row_format=fmt, impl="torch")
    err = (out.double() - torch_ref.double()).norm() / torch_ref.double().norm()
    assert err < 1.5e-2


def test_hardware_e4m3_conversion_gives_the_unpacked_rows_bits():
    """FP8_CVT (load_packed through the hardware e4m3 conversion on sm_89+; numpy's float8 in the
    interpreter) against the bf16 kernels over the rows unpacked by the torch reference, bit for bit,
    at the split-K and two-pass decode tiles, over rows holding zero, negative-zero and subnormal
    codes (a wrong decode of any of them changes the output)."""
    from v4serve.formats import row_format
    from v4serve.ops.sparse_attn_triton import DECODE_CONFIG_SMALL_PACKED, sparse_attn_paged_triton

    fmt, D, n_window = "fp8_e8m0_b64_rope64", 128, 8
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(2, 1, 16, D, n_window, 24, seed=11)
    pools = []
    for rows in (win, cmp):
        rows = rows.clone()
        rows[:, 1::5] *= 2.0**-10  # far below the block's largest value: subnormal codes
        rows[:, 2::7] = 0.0
        rows[1::2, 3::7] = -0.0
        pools.append(pack_rows(rows, fmt))
    pw, pc = pools
    codes = pw[:, :64]
    assert (((codes & 0x78) == 0) & ((codes & 7) != 0)).any() and (codes == 0x80).any()
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    for tiles in (DECODE_CONFIG_SMALL_PACKED, DECODE_CONFIG_TWO_PASS_PACKED):
        out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 0.1, counts,
                                       tile_config=dict(tiles, FP8_CVT=True), row_format=row_format(fmt))
        ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 0.1, counts, tile_config=dict(tiles))
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16)) and ref.abs().amax() > 0


def test_unpack_route_has_the_bits_of_the_bf16_launch_over_unpacked_pools():
    """KERNEL "unpack" (sparse_attn_unpacked_decode.py: each token's columns unpacked into a scratch
    pool, then the bf16 launch) against the bf16 launch over the pools unpacked by the torch
    reference: the same values in the same column order, so the same bits."""
    from v4serve.formats import row_format
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    fmt, D, n_window = "fp8_e8m0_b64_rope64", 128, 8
    q, pw, pc, idx, sink, counts = _packed_inputs(2, 1, 16, D, n_window, 24, fmt, seed=7)
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    assert (idx < 0).any() and (counts < 24).any()  # holes and columns past the live count
    for inner in (DECODE_CONFIG_SMALL, DECODE_CONFIG_TWO_PASS):
        out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 0.1, counts, row_format=row_format(fmt),
                                       tile_config=dict(KERNEL="unpack", INNER=inner))
        ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 0.1, counts, tile_config=dict(inner))
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16)) and ref.abs().amax() > 0


def test_whole_tile_scores_pass_over_packed_rows_equals_it_over_unpacked_rows():
    """The two-pass scores pass with WHOLE_TILE (one round of loads, S as one dot; production over
    packed rows) over packed rows against the same launch over the rows unpacked by the torch
    reference, bit for bit."""
    from v4serve.formats import row_format
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    fmt, D, n_window = "fp8_e8m0_b64_rope64", 128, 8
    q, pw, pc, idx, sink, counts = _packed_inputs(2, 1, 64, D, n_window, 24, fmt, seed=9)
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    tiles = DECODE_CONFIG_TWO_PASS_PACKED
    assert tiles["WHOLE_TILE"]
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 0.1, counts, tile_config=dict(tiles),
                                   row_format=row_format(fmt))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 0.1, counts, tile_config=dict(tiles))
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16)) and ref.abs().amax() > 0


def test_prefetched_values_pass_has_the_bits_of_the_bf16_kernel_over_unpacked_rows():
    """PREFETCH (the two-pass values pass over packed rows loads the next step's bytes one step
    ahead) against the same launch over the rows unpacked by the torch reference, bit for bit: five
    tiles (three steps, an odd count: the last step's second tile is empty), holes, columns past
    the live count, and output dims in both the codes and the rope tail."""
    from v4serve.formats import row_format
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    fmt, D, n_window = "fp8_e8m0_b64_rope64", 128, 8
    q, pw, pc, idx, sink, counts = _packed_inputs(2, 1, 16, D, n_window, 300, fmt, seed=13)
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    assert (idx < 0).any() and (counts < 300).any() and int(counts.max()) + n_window > 4 * 64
    tiles = DECODE_CONFIG_TWO_PASS_PACKED
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 0.1, counts, row_format=row_format(fmt),
                                   tile_config=dict(tiles, PREFETCH=True))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 0.1, counts, tile_config=dict(tiles))
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16)) and ref.abs().amax() > 0


def test_values_pass_over_the_scores_pass_rows_has_the_bits_of_the_bf16_kernel():
    """UNPACKED_ROWS (the scores pass writes its dequantized tiles as bf16 rows, the values pass reads
    those instead of the packed rows) against the same tiles over the rows unpacked by the torch
    reference, bit for bit: five tiles (the last step's second tile never written by the scores
    pass, so it must stay masked), holes, columns past the live count, rows of different scales,
    output dims in the codes and the rope tail. A row written at the wrong column, a token's rows
    read at another token's offset or an unwritten tile read unmasked all change the output."""
    from v4serve.formats import row_format
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton
    from v4serve.ops.sparse_attn_two_pass import two_pass_scores

    fmt, D, n_window = "fp8_e8m0_b64_rope64", 128, 8
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(2, 1, 64, D, n_window, 300, seed=17)
    win[::2] *= 16.0
    pw, pc = pack_rows(win, fmt), pack_rows(cmp, fmt)
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    assert (idx < 0).any() and (counts < 300).any() and int(counts.max()) + n_window > 4 * 64
    tiles = DECODE_CONFIG_TWO_PASS_PACKED
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 0.1, counts, row_format=row_format(fmt),
                                   tile_config=dict(tiles, UNPACKED_ROWS=True))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 0.1, counts, tile_config=dict(tiles))
    assert ref[..., :64].abs().amax() > 0 and ref[..., 64:].abs().amax() > 0
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
    # the rows themselves: each live column's unpacked row at (token, column), holes zero
    from v4serve.ops.kv_pack_triton import packed_constexprs

    T, C = idx.shape[0], idx.shape[-1]
    it, ct = idx.reshape(T, C), counts.reshape(T)
    pk = dict(PACKED=True, **packed_constexprs(row_format(fmt), D), PK_FP8_CVT=False)
    *_, rows = two_pass_scores(q.reshape(T, 64, D), pw, pc, it, ct, sink, n_window, 0.1, True, False,
                               dict(tiles, UNPACKED_ROWS=True), pk)
    for t in range(T):
        for c in range(int(ct[t]) + n_window):
            r = int(it[t, c])
            want = torch.zeros(D, dtype=torch.bfloat16) if r < 0 else (uw if c < n_window else uc)[r]
            assert torch.equal(rows[t, c].view(torch.int16), want.view(torch.int16)), (t, c)


@pytest.mark.parametrize("tail_programs,block_dv", [(True, 32), (True, 64), (False, 32)])
def test_values_programs_over_codes_or_tail_have_the_bits_of_the_bf16_kernel(tail_programs, block_dv):
    """TAIL_PROGRAMS (each two-pass values program reads either e4m3 codes or the bf16 rope tail,
    branching once per program) and the per-value select it replaces, against the same launch over
    the rows unpacked by the torch reference, bit for bit. At D 128 the rope64 rows hold 64 codes
    and 64 tail channels: 32-dim programs are two of each kind, 64-dim programs one; blocks of
    different scales, so a tail read as codes, codes read without their scale or a program reading
    the other kind's dims all change the output."""
    from v4serve.formats import row_format
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    fmt, D, n_window = "fp8_e8m0_b64_rope64", 128, 8
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(3, 1, 64, D, n_window, 150, seed=21)
    win[::2] *= 16.0  # rows of different scales
    pw, pc = pack_rows(win, fmt), pack_rows(cmp, fmt)
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    tiles = dict(DECODE_CONFIG_TWO_PASS_PACKED, BLOCK_DV=block_dv)
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 0.1, counts, row_format=row_format(fmt),
                                   tile_config=dict(tiles, TAIL_PROGRAMS=tail_programs))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 0.1, counts, tile_config=dict(tiles))
    assert ref[..., :64].abs().amax() > 0 and ref[..., 64:].abs().amax() > 0
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


# Issue 17's B8 variants (cases.PACKED_B8_VARIANTS): the bf16 operand boundary is off in the
# interpreter (no inline asm), the launcher drops it there; the Gluon passes fall back to the `tl` ones.
@pytest.mark.parametrize("variant", list(PACKED_B8_VARIANTS))
def test_b8_variants_have_the_bits_of_the_bf16_kernel_over_unpacked_rows(variant):
    """Each B8 variant over packed rows against production's tiles over the rows unpacked by the torch
    reference. Integer-valued q and rows (every partial sum of S and of P V exact in fp32, so neither
    the head / dim partition of the programs nor the transposed dot's summation order can matter):
    bit for bit. Five tiles (three values steps, the last one half empty), holes, columns past the
    live count, rows of different scales and output dims in both the codes and the rope tail: a dim
    read from another program's slice, a head group reading another's P, a transposed store or a
    tile left out all change the output."""
    from v4serve.formats import row_format
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    fmt, D, n_window = "fp8_e8m0_b64_rope64", 128, 8
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(2, 1, 64, D, n_window, 300, seed=17)
    q, win, cmp = ((t.float() * 2).round().clamp(-4, 4).bfloat16() for t in (q, win, cmp))
    win[::2] *= 16.0  # rows of different scales (still exact)
    pw, pc = pack_rows(win, fmt), pack_rows(cmp, fmt)
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    assert torch.equal(uw, win) and torch.equal(uc, cmp)
    assert (idx < 0).any() and (counts < 300).any() and int(counts.max()) + n_window > 4 * 64
    tiles = DECODE_CONFIG_TWO_PASS_PACKED
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 1 / 64, counts, row_format=row_format(fmt),
                                   tile_config=dict(tiles, **PACKED_B8_VARIANTS[variant]))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 1 / 64, counts, tile_config=dict(tiles))
    assert ref[..., :64].abs().amax() > 0 and ref[..., 64:].abs().amax() > 0
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16))


def test_b8_values_variants_on_real_values_are_the_bf16_kernel_within_summation_order():
    """The values variants on random (not integer) values: within fp32 summation order of the bf16
    kernel over the unpacked rows (the interpreter's numpy matmul may sum a transposed or narrower
    dot in another order)."""
    from v4serve.formats import row_format
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    fmt, D, n_window = "fp8_e8m0_b64_rope64", 128, 8
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(2, 1, 64, D, n_window, 150, seed=29)
    pw, pc = pack_rows(win, fmt), pack_rows(cmp, fmt)
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    tiles = DECODE_CONFIG_TWO_PASS_PACKED
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 0.1, counts, tile_config=dict(tiles))
    for name, variant in PACKED_B8_VARIANTS.items():
        if "values" in name:
            out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 0.1, counts, row_format=row_format(fmt),
                                           tile_config=dict(tiles, **variant))
            assert rel_err(out, ref) < 1e-5, (name, rel_err(out, ref))


@pytest.mark.parametrize("kind", ["prefill", "split-k decode"])
def test_sliced_scores_equal_the_whole_tile_dot_when_sums_are_exact(kind):
    """The sliced kernel (S as a chain of dots over head-dim slices) against the whole-tile kernel.
    With small integers in q and the rows every partial sum of S is exact in fp32, so the order of
    the sums (numpy's in the interpreter) cannot matter and the outputs must be bit-identical; a
    slice read at the wrong channels, or a slice left out, changes them."""
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    B, M, H, _ = CONFIGS[kind]
    sliced = CONFIGS[kind + " sliced"][3]
    whole = {k: v for k, v in sliced.items() if k != "QK_SLICE"}  # the same tiles, S as one dot
    for D in (128, 96):  # 96: a partial last slice
        q, win, cmp, idx, sink, counts = sparse_attn_inputs(B, M, H, D, 40, 70, seed=D)
        q, win, cmp = ((t * 2).round().clamp(-4, 4) for t in (q, win, cmp))
        out = sparse_attn_paged_triton(q, win, cmp, idx, 40, sink, 0.1, counts, tile_config=dict(sliced))
        ref = sparse_attn_paged_triton(q, win, cmp, idx, 40, sink, 0.1, counts, tile_config=dict(whole))
        assert torch.equal(out.view(torch.int16), ref.view(torch.int16))
        assert ref.abs().max() > 0


def test_norm_rope_packed_store_kernel():
    g = torch.Generator().manual_seed(4)
    x = torch.randn(6, 128, generator=g).bfloat16()
    w = torch.randn(128, generator=g).bfloat16()
    cos, sin = torch.randn(6, 32, generator=g), torch.randn(6, 32, generator=g)
    pools = {impl: torch.zeros(8, 208, dtype=torch.uint8) for impl in ("torch", "triton")}
    rows = torch.tensor([7, 0, -1, 3, 2, 5])
    for impl, pool in pools.items():
        rms_norm_rope(x, 1e-6, w, cos, sin, impl=impl, pool=pool, rows=rows, row_format="fp8_e8m0_b64_rope64")
    assert torch.equal(pools["torch"], pools["triton"]) and pools["torch"].any()


@pytest.mark.parametrize("Dk", [128, 64])
def test_index_scores_over_packed_keys_match_the_bf16_kernel_over_unpacked(Dk):
    from v4serve.ops.indexer import index_scores
    from v4serve.ops.kv_quant import hadamard

    g = torch.Generator().manual_seed(Dk)
    B, S, H, N, T = 2, 3, 16, 50, 70
    q = torch.randn(B, S, H, Dk, generator=g).bfloat16()
    w = torch.randn(B, S, H, generator=g)
    keys = hadamard(torch.randn(N, Dk, generator=g) * torch.exp2(torch.randint(-40, 40, (N, 1), generator=g).float()))
    keys[0] = 0.0
    keys[1] = 1e-38  # blocks at the scale floor: 0.5 * 2^-126 is a subnormal
    packed = pack_rows(keys.bfloat16(), "fp4_e8m0_b32")
    buf = torch.zeros(N + 1, packed.shape[1], dtype=torch.uint8)
    pool = buf[1:]  # a view 68 B into its buffer: 4-byte aligned, not 16
    pool.copy_(packed)
    rows = torch.randint(-1, N, (B, T), generator=g).to(torch.int32)
    rows[0, :4] = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    vis = torch.randint(0, T + 1, (B, S), generator=g).to(torch.int32)
    vis[0, 0] = T
    out = index_scores(q, w, pool, rows, vis, row_format="fp4_e8m0_b32", impl="triton")
    unpacked = unpack_rows(pool, "fp4_e8m0_b32", Dk, impl="torch")
    ref = index_scores(q, w, unpacked, rows, vis, impl="triton")
    # within fp32 summation order: the packed kernel sums channels in pair order (fp4_words_triton.py);
    # bit for bit on exact inputs: tests/ops/test_indexer_kernel.py
    finite = torch.isfinite(ref)
    assert finite.any() and torch.equal(torch.isfinite(out), finite)
    assert rel_err(out[finite], ref[finite]) < 1e-5


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_compress_decode_packed_output_is_the_pack_of_its_rows(overlap, impl):
    g = torch.Generator().manual_seed(5)
    B, r, d, fmt = 4, 4, 128, "fp8_e8m0_b64_rope64"
    width = (2 if overlap else 1) * d
    if overlap:
        kv_state = torch.zeros(B + 1, 2 * r, width)
        state = (kv_state, torch.full_like(kv_state, float("-inf")))
    else:
        state = tuple(torch.full((B + 1, d), v) for v in (float("-inf"), 0.0, 0.0))
    rows_of = torch.arange(B * 4, dtype=torch.int32).view(B, 4)
    pool = torch.full((B * 4 + 1, 208), 0x5A, dtype=torch.uint8)
    positions = torch.tensor([3, 7, 6, 11])  # three complete a block, one goes to scratch
    cos, sin = torch.randn(B, 32, generator=g), torch.randn(B, 32, generator=g)
    kv, score = torch.randn(B, width, generator=g), torch.randn(B, width, generator=g)
    rows, target = compress_decode(kv, score, positions, torch.arange(B), torch.randn(r, width, generator=g), state, r,
                                   torch.rand(d, generator=g) + 0.5, 1e-6, cos, sin, rows_of, B * 4, torch.bfloat16,
                                   impl=impl, pool=pool, row_format=fmt)
    packed = pack_rows(rows, fmt, impl="torch")
    assert torch.equal(pool[target], packed)
    assert rows[2].abs().sum() == 0 and target[2] == B * 4 and rows[0].abs().sum() > 0
    untouched = torch.ones(pool.shape[0], dtype=torch.bool)
    untouched[target] = False
    assert (pool[untouched] == 0x5A).all()


@pytest.mark.parametrize("fmt,D", [("fp8_e8m0_b64_rope64", 128), ("fp8_e8m0_b32", 64)])
def test_production_prefill_over_packed_rows_is_the_bf16_launch_over_unpacked_rows(fmt, D):
    """Production prefill over packed rows unpacks each referenced row once (ops/kv_compact.py) and
    runs the bf16 prefill kernel: the same bits as that kernel over every row unpacked."""
    from v4serve.formats import row_format
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    q, pw, pc, idx, sink, counts = _packed_inputs(2, 3, 16, D, 40, 70, fmt, seed=D)
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    assert (idx[..., 40:] < 0).any() and (idx >= 0).any()  # holes and live columns both present
    out = sparse_attn_paged_triton(q, pw, pc, idx, 40, sink, 0.1, counts, row_format=row_format(fmt))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, 40, sink, 0.1, counts)
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16)) and ref.abs().amax() > 0


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_unpack_referenced_rows_keeps_the_values_each_column_names(impl):
    from v4serve.formats import row_format
    from v4serve.ops.kv_compact import unpack_referenced_rows

    fmt, D = row_format("fp8_e8m0_b64_rope64"), 128
    win, cmp = pack_rows(_rows(10, D, seed=2), fmt), pack_rows(_rows(50, D, seed=3), fmt)
    # two window columns, then compressed ones; row 7 of each pool named (different rows)
    cols = torch.tensor([[7, -1, 7, 49], [0, 3, -1, -1], [-1, -1, -1, -1], [7, 9, 0, 7]], dtype=torch.int32)
    rows, renumbered = unpack_referenced_rows(win, cmp, cols, 2, fmt, D, impl=impl)
    # window rows 0, 3, 7, 9; compressed rows 0, 7, 49: each unpacked once, in pool order
    live = cols >= 0
    assert torch.equal(renumbered < 0, ~live) and renumbered.dtype == torch.int32
    assert sorted(set(renumbered[live].tolist())) == list(range(7)) and rows.shape[0] >= 7
    full = torch.cat([unpack_rows(win, fmt, D, impl="torch"), unpack_rows(cmp, fmt, D, impl="torch")])
    g = torch.where(torch.arange(4) < 2, cols, cols + 10)
    assert torch.equal(rows[renumbered[live].long()].view(torch.int16), full[g[live].long()].view(torch.int16))
    assert torch.equal(renumbered[0], torch.tensor([2, -1, 5, 6], dtype=torch.int32))  # pool order: slots by g


def _compaction_case(seed):
    """Packed pools as views at a row offset into one buffer, a strided column table with holes,
    repeats and dead columns past counts (naming rows no live column names, below the live ones,
    so flagging one would move every live slot)."""
    from v4serve.formats import row_format

    fmt, D = row_format("fp8_e8m0_b64_rope64"), 128
    g = torch.Generator().manual_seed(seed)
    n_w, n_c, T, n_window, K = 37, 90, 9, 5, 11
    rb = -(-fmt.row_bytes(D) // 16) * 16
    buf = torch.zeros(1 + n_w + n_c, rb, dtype=torch.uint8)
    win, cmp = buf[1 : 1 + n_w], buf[1 + n_w :]
    win.copy_(pack_rows(_rows(n_w, D, seed=seed), fmt))
    cmp.copy_(pack_rows(_rows(n_c, D, seed=seed + 1), fmt))
    table = torch.cat([torch.randint(-1, n_w, (T, n_window), generator=g),
                       torch.randint(n_c // 2 - 1, n_c, (T, K), generator=g)], 1).to(torch.int32)
    counts = torch.randint(0, K + 1, (T,), generator=g).to(torch.int32)
    counts[0] = -3  # a negative count is none
    dead = torch.arange(K)[None, :] >= counts.clamp(min=0)[:, None]
    table[:, n_window:][dead] = torch.randint(0, n_c // 2 - 1, (int(dead.sum()),), generator=g).to(torch.int32)
    wide = torch.full((T, 2 * (n_window + K)), 77, dtype=torch.int32)
    wide[:, ::2] = table
    return win, cmp, wide[:, ::2], n_window, fmt, D, counts


@pytest.mark.parametrize("max_rows", [None, 0, 13])
def test_compaction_kernels_match_the_reference(max_rows):
    """Triton (interpreter) against the torch reference: every used row's bits, every column; a
    bound under the used count (13) drops the rows past it on both sides."""
    from v4serve.ops.kv_compact import unpack_referenced_rows
    from v4serve.ops.kv_compact_reference import live_column_mask

    win, cmp, cols, n_window, fmt, D, counts = _compaction_case(seed=5)
    live = live_column_mask(cols, n_window, counts)
    g = torch.where(torch.arange(cols.shape[1]) < n_window, cols, cols + win.shape[0])
    used = int(torch.unique(g[live]).numel())
    bound = used if max_rows == 0 else max_rows  # 0: the tight bound
    ref_rows, ref_cols = unpack_referenced_rows(win, cmp, cols, n_window, fmt, D, counts=counts, max_rows=bound,
                                                impl="torch")
    rows, out_cols = unpack_referenced_rows(win, cmp, cols, n_window, fmt, D, counts=counts, max_rows=bound,
                                            impl="triton")
    kept = min(used, rows.shape[0])
    assert used > 13 and (max_rows is not None or rows.shape[0] >= used)
    assert torch.equal(out_cols, ref_cols) and int((out_cols >= 0).sum()) <= int(live.sum())
    assert torch.equal(rows[:kept].view(torch.int16), ref_rows[:kept].view(torch.int16))
    assert torch.equal(out_cols >= 0, live) == (kept == used)


def test_prefill_over_packed_rows_with_the_tight_bound_is_the_bf16_launch():
    """unpack_bound = the exact number of used rows (the smallest correct bound) gives the bits of
    the bf16 kernel over every row unpacked."""
    from v4serve.formats import row_format
    from v4serve.ops.kv_compact_reference import live_column_mask
    from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

    fmt, D = "fp8_e8m0_b64_rope64", 128
    q, pw, pc, idx, sink, counts = _packed_inputs(1, 5, 16, D, 40, 70, fmt, seed=3)
    cols, live = idx.reshape(5, -1), live_column_mask(idx.reshape(5, -1), 40, counts)
    used = int(torch.unique(torch.where(torch.arange(cols.shape[1]) < 40, cols, cols + pw.shape[0])[live]).numel())
    uw, uc = unpack_rows(pw, fmt, D, impl="torch"), unpack_rows(pc, fmt, D, impl="torch")
    out = sparse_attn_paged_triton(q, pw, pc, idx, 40, sink, 0.1, counts, row_format=row_format(fmt),
                                   unpack_bound=used)
    ref = sparse_attn_paged_triton(q, uw, uc, idx, 40, sink, 0.1, counts)
    assert used < pw.shape[0] + pc.shape[0]
    assert torch.equal(out.view(torch.int16), ref.view(torch.int16)) and ref.abs().amax() > 0


def test_compaction_kernels_have_no_capture_breaking_op():
    """No host sync, no data-dependent size: the Triton compaction runs under the guard the decode
    runner's capture check uses; the torch reference (nonzero) does not."""
    from capture_guard import CaptureViolation, NoCaptureBreakingOps
    from v4serve.ops.kv_compact import unpack_referenced_rows

    win, cmp, cols, n_window, fmt, D, counts = _compaction_case(seed=6)
    with NoCaptureBreakingOps():
        unpack_referenced_rows(win, cmp, cols, n_window, fmt, D, counts=counts, max_rows=50, impl="triton")
    with pytest.raises(CaptureViolation), NoCaptureBreakingOps():
        unpack_referenced_rows(win, cmp, cols, n_window, fmt, D, counts=counts, max_rows=50, impl="torch")


def test_gluon_scores_pass_takes_only_q_strides_triton_marks_aligned(monkeypatch):
    """The Gluon scores pass's Q cp.async compiles only where Triton can prove 16-byte alignment: both
    strides multiples of 16 elements (an integer argument is marked aligned only at % 16). The
    format / device half of the rule is set aside here (it says no on the CPU)."""
    import v4serve.ops.sparse_attn_scores_gluon as scores_gluon

    monkeypatch.setattr(scores_gluon, "v4_rows_apply", lambda *args: True)
    base = torch.empty(2 * 2 * 8 * 520, dtype=torch.bfloat16)
    applies = lambda stride: scores_gluon.scores_gluon_applies(  # noqa: E731
        base.as_strided((2, 8, 512), stride), {}, 64, ())
    assert applies((8 * 512, 512, 1))
    assert not applies((8 * 520, 520, 1))  # rows 16-byte aligned (520 = 8 * 65), not marked aligned
    assert not applies((8 * 512 + 8, 512, 1))
    assert not applies((8 * 512, 512, 2))
