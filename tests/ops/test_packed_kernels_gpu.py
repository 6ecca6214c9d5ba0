"""Kernels over packed KV rows at the PR shapes on the GPU (`pytest -m gpu tests/ops`): attention and
indexer over packed rows against the same kernels over the rows dequantized by the torch reference.

Attention pools are fp8_e8m0_b64_rope64 rows of the bench cases (v4serve/bench/shapes.py, the
FreeToken PR shapes by name), index keys fp4_e8m0_b32. Per attention shape:
- prefill: the production launch over packed rows (each referenced row unpacked once,
  ops/kv_compact.py, then the bf16 prefill kernels) has the bits of the production bf16 launch over
  every row unpacked; the compaction kernels match their torch reference; the launch records into
  a CUDA graph (no host sync) whose replays equal eager calls;
- decode: the production launch over packed rows (dequantized in the kernel) against the same
  tiles over the unpacked bf16 rows, within fp32 accumulation-order rounding (H200, session 9's
  kernels: relative 2.6e-7 to 5.5e-5 over the six decode shapes, a few outputs one bf16 ulp apart;
  a wrong scale or channel gives ~1), and the torch reference over the unpacked rows within bf16
  rounding; on integer-valued q and rows (S exact in any order) every output within one bf16 ulp
  and nearly all bit for bit (the dequantized mma operands have kWidth 4, the bf16 ones 2: the k
  order inside each mma.sync of P V differs, and P V's sums are not exact);
- the hardware e4m3 conversion (FP8_CVT, production on sm_89+) against the integer one, bit for
  bit (the same values reach the same dots);
- the sliced kernel (S as a chain of dots over head-dim slices) against the whole-tile kernel at
  the same tiles, bit for bit, on integer-valued q and rows, where every partial sum of S is exact
  in fp32 (on real values the chain rounds differently from one dot: 7e-5 at the prefill tiles on
  the H200), so a slice read at the wrong channels or left out shows.
"""

import pytest
import torch
from cases import PACKED_B8_VARIANTS, rel_err

from v4serve.bench.shapes import all_shapes, indexer_case, sparse_decode_case, sparse_prefill_case
from v4serve.ops.indexer import index_scores
from v4serve.ops.kv_pack import pack_rows, unpack_rows
from v4serve.ops.kv_pack_triton import packed_constexprs
from v4serve.formats import row_format
from v4serve.ops.sparse_attn import sparse_attn_paged
from v4serve.ops.sparse_attn_triton import (
    DECODE_CONFIG_SMALL_PACKED_SLICED, decode_config, prefill_config, sparse_attn_paged_triton)
from v4serve.ops.sparse_attn_scores_gluon import scores_gluon_applies
from v4serve.ops.sparse_attn_values_gluon import values_gluon_applies

pytestmark = pytest.mark.gpu

KV_FORMAT, INDEX_FORMAT = "fp8_e8m0_b64_rope64", "fp4_e8m0_b32"
SHAPES = all_shapes()
ATTN_SHAPES = [n for n, (kind, _) in SHAPES.items() if kind in ("prefill", "decode")]
INDEXER_SHAPES = [n for n, (kind, _) in SHAPES.items() if kind == "indexer"]


def _packed_case(name):
    kind, args = SHAPES[name]
    case = (sparse_prefill_case if kind == "prefill" else sparse_decode_case)(*args, device="cuda", seed=len(name))
    q, win, cmp, idx, n_window, sink, scale, counts = case.args()
    pw, pc = pack_rows(win, KV_FORMAT), pack_rows(cmp, KV_FORMAT)
    D = q.shape[-1]
    uw, uc = unpack_rows(pw, KV_FORMAT, D, impl="torch"), unpack_rows(pc, KV_FORMAT, D, impl="torch")
    return kind, (q, idx, n_window, sink, scale, counts), (pw, pc), (uw, uc)


def _same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("name", ATTN_SHAPES)
def test_attention_over_packed_rows_is_the_bf16_kernel_over_unpacked_rows(name):
    kind, (q, idx, n_window, sink, scale, counts), (pw, pc), (uw, uc) = _packed_case(name)
    B, M = q.shape[:2]
    out = sparse_attn_paged(q, pw, pc, idx, n_window, sink, scale, counts, row_format=KV_FORMAT, impl="triton")
    assert not out.isnan().any() and out.abs().amax() > 0
    if kind == "prefill":
        ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, scale, counts)  # production bf16 tiles
        assert _same_bits(out, ref), f"{name}: packed vs bf16 rows: rel err {rel_err(out, ref):.3g}"
        return
    tiles = decode_config(B, idx.shape[-1], packed=True, device=q.device)
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, scale, counts, tile_config=dict(tiles))
    assert rel_err(out, ref) < 5e-4, f"{name}: packed vs bf16 rows at {tiles}: rel err {rel_err(out, ref):.3g}"
    torch_ref = sparse_attn_paged(q.float(), uw.float(), uc.float(), idx, n_window, sink, scale, counts,
                                  impl="torch")
    assert rel_err(out, torch_ref) < 1e-2


def _integer_valued(*tensors):
    """Small integers (-4..4) in bf16: every partial sum of q . k is exact in fp32, whatever its order."""
    return tuple((t.float() * 2).round().clamp(-4, 4).bfloat16() for t in tensors)


DECODE_SHAPES = [n for n in ATTN_SHAPES if SHAPES[n][0] == "decode"]


@pytest.mark.parametrize("name", DECODE_SHAPES)
def test_packed_decode_is_the_bf16_kernel_when_scores_are_exact(name):
    """Production decode over packed rows against the bf16 kernels at the same tiles over the same
    values (rows of small integers pack exactly, and S is exact in any order): every output within
    one bf16 ulp, at most 0.1% of them not bit-equal (P V's summation order inside the mma); a
    wrong scale, channel or row moves most outputs by far more."""
    _, (q, idx, n_window, sink, scale, counts), _, (uw, uc) = _packed_case(name)
    q, uw, uc = _integer_valued(q, uw, uc)
    pw, pc = pack_rows(uw, KV_FORMAT), pack_rows(uc, KV_FORMAT)
    assert torch.equal(unpack_rows(pw, KV_FORMAT, q.shape[-1], impl="torch"), uw)
    scale = 1 / 64  # a power of two: the scaled scores stay exact
    out = sparse_attn_paged(q, pw, pc, idx, n_window, sink, scale, counts, row_format=KV_FORMAT, impl="triton")
    tiles = decode_config(q.shape[0], idx.shape[-1], packed=True, device=q.device)
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, scale, counts, tile_config=dict(tiles))
    assert ref.abs().amax() > 0
    diff, mag = (out.float() - ref.float()).abs(), ref.float().abs()
    one_ulp = torch.maximum(mag * 2.0**-7, mag.amax() * 1e-6)
    differing = float((diff > 0).float().mean())
    assert (diff <= one_ulp).all() and differing < 1e-3, (
        f"{name}: packed vs bf16 rows at {tiles}: rel err {rel_err(out, ref):.3g}, {differing:.2%} of outputs differ")


# kernel_configs' candidates over packed rows at B >= 2 (not production): PREFETCH (the two-pass
# values pass loads the next step's bytes one step ahead), values programs reading codes or the tail
# only (TAIL_PROGRAMS: measured slower in session 12, off in production), the values pass over 8
# warps and over 64 dims a program; then issue 17's B8 variants (cases.PACKED_B8_VARIANTS).
VARIANT_TILES = {"PREFETCH": dict(PREFETCH=True), "tail programs": dict(TAIL_PROGRAMS=True),
                 "values 8 warps": dict(VALUES=dict(num_warps=8, num_stages=3)),
                 "values 64 dims": dict(BLOCK_DV=64, VALUES=dict(num_warps=8, num_stages=3)),
                 **PACKED_B8_VARIANTS}
VARIANTS = [(name, variant) for name in DECODE_SHAPES for variant in VARIANT_TILES if "B1" not in name]


@pytest.mark.parametrize("name,variant", VARIANTS)
def test_packed_decode_variants_are_the_bf16_kernel_over_unpacked_rows(name, variant):
    """A variant at the production tiles: against the same tiles over the unpacked bf16 rows within
    fp32 summation order, against the torch reference within bf16 rounding, and on integer-valued
    q and rows (S exact in any order) within one bf16 ulp, nearly all bit for bit, as the
    production kernels."""
    _, (q, idx, n_window, sink, scale, counts), (pw, pc), (uw, uc) = _packed_case(name)
    tiles = decode_config(q.shape[0], idx.shape[-1], packed=True, device=q.device)
    fmt = row_format(KV_FORMAT)
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, scale, counts, row_format=fmt,
                                   tile_config=dict(tiles, **VARIANT_TILES[variant]))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, scale, counts, tile_config=dict(tiles))
    assert not out.isnan().any() and ref.abs().amax() > 0
    assert rel_err(out, ref) < 5e-4, f"{name}: rel err {rel_err(out, ref):.3g}"
    torch_ref = sparse_attn_paged(q.float(), uw.float(), uc.float(), idx, n_window, sink, scale, counts,
                                  impl="torch")
    assert rel_err(out, torch_ref) < 1e-2
    q, uw, uc = _integer_valued(q, uw, uc)
    pw, pc = pack_rows(uw, KV_FORMAT), pack_rows(uc, KV_FORMAT)
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 1 / 64, counts, row_format=fmt,
                                   tile_config=dict(tiles, **VARIANT_TILES[variant]))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, 1 / 64, counts, tile_config=dict(tiles))
    diff, mag = (out.float() - ref.float()).abs(), ref.float().abs()
    assert (diff <= torch.maximum(mag * 2.0**-7, mag.amax() * 1e-6)).all() and float((diff > 0).float().mean()) < 1e-3


B8_SHAPES = [n for n in DECODE_SHAPES if "B1" not in n]
# Variants that give production's packed bits on the H200 (session 16: the transposed values dot at
# h64 sums the same products in the same k16 steps with the operands' roles swapped). Predicted but
# measured otherwise, so left to the within-summation-order test above: "scores 4 warps" (one m64n64
# wgmma a step instead of two m64n32 halves: rel err 6-7e-6 at every B8 shape) and "values kv lhs
# dv64 h32" (7.6e-7 at r4).
SAME_BITS_VARIANTS = ["values kv lhs dv64 h64"]


@pytest.mark.parametrize("name,variant", [(n, v) for n in B8_SHAPES for v in SAME_BITS_VARIANTS])
def test_b8_variants_have_the_production_packed_bits(name, variant):
    """The variants above against the production launch over the same packed rows, bit for bit (a
    failure with a small relative error means the hardware sums a k16 step of the swapped operands in
    another order: the variant is then within fp32 summation order, as the variant test above checks)."""
    _, (q, idx, n_window, sink, scale, counts), (pw, pc), _ = _packed_case(name)
    tiles = decode_config(q.shape[0], idx.shape[-1], packed=True, device=q.device)
    fmt = row_format(KV_FORMAT)
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, scale, counts, row_format=fmt,
                                   tile_config=dict(tiles, **VARIANT_TILES[variant]))
    ref = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, scale, counts, row_format=fmt,
                                   tile_config=dict(tiles))
    assert ref.abs().amax() > 0 and _same_bits(out, ref), f"{name} {variant}: rel err {rel_err(out, ref):.3g}"


@pytest.mark.parametrize("name", B8_SHAPES)
def test_values_over_the_scores_pass_rows_have_the_bits_of_the_bf16_kernel(name):
    """UNPACKED_ROWS (the scores pass writes its dequantized tiles as bf16 rows, the values pass runs
    the bf16 loop over them) against the same tiles over the rows unpacked by the torch reference, bit
    for bit at the PR's B8 shapes: the scores pass gets the same values into the same dot, and the
    values pass is the bf16 code over the same values (a row at the wrong column, a token's rows at
    another's offset or a race with the scores pass changes outputs)."""
    _, (q, idx, n_window, sink, scale, counts), (pw, pc), (uw, uc) = _packed_case(name)
    tiles = decode_config(q.shape[0], idx.shape[-1], packed=True, device=q.device)
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, scale, counts, row_format=row_format(KV_FORMAT),
                                   tile_config=dict(tiles, UNPACKED_ROWS=True))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, scale, counts, tile_config=dict(tiles))
    assert ref.abs().amax() > 0 and _same_bits(out, ref), f"{name}: rel err {rel_err(out, ref):.3g}"


@pytest.mark.parametrize("name", DECODE_SHAPES)
def test_hardware_e4m3_conversion_has_the_bits_of_the_integer_one(name):
    _, (q, idx, n_window, sink, scale, counts), (pw, pc), _ = _packed_case(name)
    tiles = decode_config(q.shape[0], idx.shape[-1], packed=True, device=q.device)
    fmt = row_format(KV_FORMAT)
    out = {cvt: sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, scale, counts, row_format=fmt,
                                         tile_config=dict(tiles, FP8_CVT=cvt)) for cvt in (True, False)}
    assert out[False].abs().amax() > 0
    assert _same_bits(out[True], out[False]), f"{name}: rel err {rel_err(out[True], out[False]):.3g}"


@pytest.mark.parametrize("name", [n for n in ATTN_SHAPES if "B8" not in n])  # B8: the two-pass kernels
def test_sliced_scores_have_the_bits_of_the_whole_tile_dot(name):
    _, (q, idx, n_window, sink, scale, counts), _, (uw, uc) = _packed_case(name)
    B, M = q.shape[:2]
    # prefill: the packed prefill tiles; decode: session 9's sliced split-K tiles
    sliced = prefill_config(q.device, q.shape[-1], packed=True) if M > 1 else DECODE_CONFIG_SMALL_PACKED_SLICED
    assert sliced.get("QK_SLICE")
    whole = {k: v for k, v in sliced.items() if k != "QK_SLICE"}
    q, uw, uc = _integer_valued(q, uw, uc)
    scale = 1 / 64  # a power of two: the scaled scores stay exact
    out = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, scale, counts, tile_config=dict(sliced))
    ref = sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, scale, counts, tile_config=whole)
    assert ref.abs().amax() > 0
    assert _same_bits(out, ref), f"{name}: sliced vs whole-tile S at {whole}: rel err {rel_err(out, ref):.3g}"


PREFILL_SHAPES = [n for n in ATTN_SHAPES if SHAPES[n][0] == "prefill"]


@pytest.mark.parametrize("name", PREFILL_SHAPES)
def test_compaction_kernels_match_the_reference_at_the_pr_shapes(name):
    """The sync-free compaction (ops/kv_compact.py) against its torch reference: the renumbered
    columns and every used row's bits, at the tight bound (the used count) and the shapes' one."""
    from v4serve.formats import row_format
    from v4serve.ops.kv_compact import unpack_referenced_rows

    _, (q, idx, n_window, sink, scale, counts), (pw, pc), _ = _packed_case(name)
    fmt, D = row_format(KV_FORMAT), q.shape[-1]
    cols, ct = idx.reshape(-1, idx.shape[-1]), counts.reshape(-1)
    ref_rows, ref_cols = unpack_referenced_rows(pw, pc, cols, n_window, fmt, D, counts=ct, impl="torch")
    used = int(ref_cols.max()) + 1
    assert used > 1000
    for bound in (None, used):
        rows, out_cols = unpack_referenced_rows(pw, pc, cols, n_window, fmt, D, counts=ct, max_rows=bound,
                                                impl="triton")
        assert torch.equal(out_cols, ref_cols), f"{name}: renumbered columns differ (bound {bound})"
        assert _same_bits(rows[:used], ref_rows[:used]), f"{name}: unpacked rows differ (bound {bound})"


@pytest.mark.parametrize("name", PREFILL_SHAPES)
def test_prefill_over_packed_rows_captures_in_a_cuda_graph(name):
    """No host sync: the production prefill over packed rows records into a CUDA graph; replays give
    the eager call's bits, and read the pools' bytes at replay time (new rows, new output)."""
    _, (q, idx, n_window, sink, scale, counts), (pw, pc), _ = _packed_case(name)
    run = lambda: sparse_attn_paged(q, pw, pc, idx, n_window, sink, scale, counts,  # noqa: E731
                                    row_format=KV_FORMAT, impl="triton")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and warm up outside the capture
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = run()
    for step in range(2):
        if step:
            pw.copy_(pw.roll(1, 0))
            pc.copy_(pc.roll(1, 0))
        graph.replay()
        eager = run()
        torch.cuda.synchronize()
        assert _same_bits(captured, eager) and eager.abs().amax() > 0, f"{name}: replay {step} differs from eager"


@pytest.mark.parametrize("name", INDEXER_SHAPES)
def test_index_scores_over_packed_keys_match_the_bf16_kernel_over_unpacked_keys(name):
    _, args = SHAPES[name]
    q, w, k_pool, key_rows, n_visible = indexer_case(*args, device="cuda", seed=len(name))
    packed = pack_rows(k_pool, INDEX_FORMAT)
    unpacked = unpack_rows(packed, INDEX_FORMAT, k_pool.shape[1], impl="torch")
    out = index_scores(q, w, packed, key_rows, n_visible, row_format=INDEX_FORMAT, impl="triton")
    ref = index_scores(q, w, unpacked, key_rows, n_visible, impl="triton")
    finite = torch.isfinite(ref)
    assert finite.any() and torch.equal(torch.isfinite(out), finite)
    # the packed kernel sums the channels in another order (fp4_words_triton.py: pair order), so
    # within fp32 summation order; bit identity on exact inputs: tests/ops/test_indexer_kernel_gpu.py
    assert rel_err(out[finite], ref[finite]) < 1e-5, f"{name}: max |diff| {(out - ref)[finite].abs().max():.3g}"


GLUON_PASSES = {"values": dict(VALUES_KERNEL="gluon"), "values 2wg": dict(VALUES_KERNEL="gluon", VALUE_WARPGROUPS=2),
                "scores": dict(SCORES_KERNEL="gluon"),
                "both 2wg": dict(SCORES_KERNEL="gluon", VALUES_KERNEL="gluon", VALUE_WARPGROUPS=2)}


@pytest.mark.parametrize("passes", list(GLUON_PASSES))
def test_gluon_passes_at_edges_are_the_tl_passes(passes):
    """The Gluon passes (VALUES_KERNEL / SCORES_KERNEL "gluon") where the PR shapes do not go: 128 heads
    (two head blocks), tokens with fewer live tiles than the values ring's stages (1 and 2), one past the
    ring, a hole in every column (out exactly 0, as the `tl` kernels give), holes inside a tile, tiles
    past a token's bound (the scores pass skips them); against the production `tl` passes over the same
    packed rows within fp32 summation order, and the all-hole token bit for bit; the values pass over
    one warpgroup a program and over two (a token's tiles alternating between them: one live tile leaves
    the second with none). Also checks that both Gluon kernels apply on this device."""
    g = torch.Generator(device="cuda").manual_seed(22)
    T, H, D, n_window, C = 5, 128, 512, 128, 320
    q = torch.randn(T, 1, H, D, generator=g, device="cuda").bfloat16()
    win = torch.randn(T * n_window, D, generator=g, device="cuda").bfloat16()
    cmp = torch.randn(600, D, generator=g, device="cuda").bfloat16()
    pw, pc = pack_rows(win, KV_FORMAT), pack_rows(cmp, KV_FORMAT)
    counts = torch.tensor([0, 0, 40, 192, 150], dtype=torch.int32, device="cuda")
    win_idx = torch.arange(T, device="cuda")[:, None] * n_window + torch.arange(n_window, device="cuda")[None, :]
    win_idx[0] = -1  # token 0: every column a hole
    win_idx[1, 64:] = -1  # token 1: one live tile
    win_idx[3, ::7] = -1  # holes inside tiles
    cmp_idx = torch.randint(0, 600, (T, C - n_window), generator=g, device="cuda")
    cmp_idx = torch.where(torch.arange(C - n_window, device="cuda")[None, :] < counts[:, None], cmp_idx, -1)
    idx = torch.cat([win_idx, cmp_idx], 1).to(torch.int32)[:, None]
    sink = torch.randn(H, generator=g, device="cuda")
    fmt = row_format(KV_FORMAT)
    tiles = decode_config(T, C, packed=True, device=q.device)
    assert tiles.get("KERNEL") == "two_pass"
    pk = dict(PACKED=True, **packed_constexprs(fmt, D))
    out_probe = torch.empty(T, H, D, dtype=torch.bfloat16, device="cuda")
    assert values_gluon_applies(out_probe, pk, tiles["BLOCK_T"], C // tiles["BLOCK_T"], (pw, pc))
    assert scores_gluon_applies(q.reshape(T, H, D), pk, tiles["BLOCK_T"], (pw, pc))
    out = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 0.04, counts[:, None], row_format=fmt,
                                   tile_config=dict(tiles, **GLUON_PASSES[passes]))
    ref = sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, 0.04, counts[:, None], row_format=fmt,
                                   tile_config=dict(tiles))
    assert not out.isnan().any() and ref[1:].abs().amax() > 0
    assert torch.equal(out[0], torch.zeros_like(out[0])) and _same_bits(out[0], ref[0])
    for t in range(1, T):
        # a failure names the 64-dim blocks (7 code blocks, then the rope tail) and head blocks that differ
        blocks = [(64 * d, 64 * h, rel_err(out[t, 0, 64 * h:64 * h + 64, 64 * d:64 * d + 64],
                                           ref[t, 0, 64 * h:64 * h + 64, 64 * d:64 * d + 64]))
                  for d in range(D // 64) for h in range(H // 64)]
        assert rel_err(out[t], ref[t]) < 5e-4, (
            f"token {t}: rel err {rel_err(out[t], ref[t]):.3g}; (first dim, first head, rel err) a block: {blocks}")
