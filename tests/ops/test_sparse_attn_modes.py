"""Decode split widths, the two-pass decode and the warp-specialised prefill against the fp32 torch reference.

CPU (interpreter): split widths that are not a multiple of the tile (the last tile of a split is
partly masked), the two-pass kernels at small tiles (masked head blocks, part tiles, part blocks
of output dims, odd and even numbers of live tiles), holes, zero counts and a token whose
columns are all holes; the decode dispatch. GPU (`pytest -m gpu`): the split widths and two-pass
tiles the sweep times (v4serve/bench/kernel_configs.py) at the DeepSeek-V4 shapes, and the Gluon
prefill kernel (sm_90) at several tile rings, head counts and column layouts.
"""

import pytest
import torch
from cases import rel_err, sparse_attn_inputs

from v4serve.bench.shapes import WINDOW, sparse_decode_case, sparse_prefill_case
from v4serve.ops._dispatch import triton_at_least
from v4serve.ops.sparse_attn import sparse_attn_paged
from v4serve.ops.sparse_attn_triton import (
    DECODE_CONFIG_LIVE,
    DECODE_CONFIG_SMALL,
    DECODE_CONFIG_TWO_PASS,
    PREFILL_CONFIG,
    PREFILL_CONFIG_WS,
    decode_config,
    prefill_config,
    sparse_attn_paged_triton,
)

DECODE_SPLITS = {
    "48 columns in tiles of 32": dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=48, num_warps=4, num_stages=2),
    "96 columns in tiles of 32, 32 heads": dict(BLOCK_H=32, BLOCK_T=32, COLS_PER_SPLIT=96, num_warps=4, num_stages=2),
}


def _reference(q, win, cmp, idx, n_window, sink, scale, counts):
    return sparse_attn_paged(q.float(), win.float(), cmp.float(), idx, n_window, sink, scale, counts, impl="torch")


@pytest.mark.parametrize("mode", list(DECODE_SPLITS))
def test_decode_split_widths(mode):
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(3, 1, 40, 64, 20, 150, seed=11)
    counts[1] = 0
    idx[2, 0, :] = -1  # a token with no live column at all
    out = sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts, tile_config=DECODE_SPLITS[mode])
    assert rel_err(out, _reference(q, win, cmp, idx, 20, sink, 0.1, counts)) < 1.5e-2
    assert out[2].abs().max() == 0


def test_split_decode_merges_many_splits_in_rounds(monkeypatch):
    """Split-K decode over a wide table, merged in rounds: 180 columns in splits of 16 (12 splits)
    with MERGE_MAX_SPLITS = 4 (three rounds), tokens whose live columns end early (a short context
    in a wide cache: most splits have no live column), one with all columns live, one with only
    window columns, one with none: the reference's outputs, and the merge's rounds agree with one
    block of every split. Split programs past a token's live columns write nothing and the merge
    reads none of them: the partials start as NaN here."""
    import v4serve.ops.sparse_attn_triton as sat

    partials = sat._partials
    monkeypatch.setattr(sat, "_partials", lambda *a: tuple(t.fill_(float("nan")) for t in partials(*a)))
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(5, 1, 16, 64, 20, 160, seed=9)
    counts[:, 0] = torch.tensor([5, 40, 160, 0, 70], dtype=counts.dtype)
    idx[3, 0, :] = -1
    cfg = dict(BLOCK_H=16, BLOCK_T=16, COLS_PER_SPLIT=16, num_warps=4, num_stages=1)
    one_round = sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts, tile_config=cfg)
    monkeypatch.setattr(sat, "MERGE_MAX_SPLITS", 4)
    rounds = sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts, tile_config=cfg)
    assert rel_err(rounds, one_round) < 1e-5
    assert rel_err(rounds, _reference(q, win, cmp, idx, 20, sink, 0.1, counts)) < 1.5e-2
    assert rounds[3].abs().max() == 0 and torch.isfinite(rounds).all()


def test_split_width_follows_the_live_columns(monkeypatch):
    """WIDE_FROM / WIDE_COLS_PER_SPLIT: a token with more than WIDE_FROM live columns takes the wide
    splits, the others the narrow ones (the grid has the narrow count; the rest write nothing, the
    partials start as NaN). Tokens of 24 and 100 live columns (narrow: 2 and 7 splits of 16) and of
    180 (wide: 3 of 64) in a 180-column table: the reference's outputs, and each token's bits those
    of the one width it takes."""
    import v4serve.ops.sparse_attn_triton as sat

    partials = sat._partials
    monkeypatch.setattr(sat, "_partials", lambda *a: tuple(t.fill_(float("nan")) for t in partials(*a)))
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(3, 1, 16, 64, 20, 160, seed=13)
    counts[:, 0] = torch.tensor([4, 80, 160], dtype=counts.dtype)
    narrow = dict(BLOCK_H=16, BLOCK_T=16, COLS_PER_SPLIT=16, num_warps=4, num_stages=1)
    live = sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts,
                                    tile_config=dict(narrow, WIDE_FROM=128, WIDE_COLS_PER_SPLIT=64))
    one_width = [sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts,
                                          tile_config=dict(narrow, COLS_PER_SPLIT=cols)) for cols in (16, 64)]
    assert not torch.equal(one_width[0][2], one_width[1][2])  # the widths sum in different orders
    assert torch.equal(live[:2], one_width[0][:2]) and torch.equal(live[2:], one_width[1][2:])
    assert rel_err(live, _reference(q, win, cmp, idx, 20, sink, 0.1, counts)) < 1.5e-2


def _two_pass(block_h, block_t, block_k, block_dv, warps=4):
    return dict(KERNEL="two_pass", BLOCK_H=block_h, BLOCK_T=block_t, BLOCK_K=block_k, BLOCK_DV=block_dv,
                PDL=True, SCORES=dict(num_warps=warps, num_stages=2), VALUES=dict(num_warps=warps, num_stages=2))


TWO_PASS = {
    "tiles of 16, 32-wide slices, 32 output dims": _two_pass(16, 16, 32, 32),
    "tiles of 32, 16-wide slices, 16 output dims": _two_pass(16, 32, 16, 16),
}


@pytest.mark.parametrize("mode", list(TWO_PASS))
@pytest.mark.parametrize("D", [64, 80])
def test_two_pass_decode(mode, D):
    # 20 heads in blocks of 16 (a masked head block), 170 columns (a part tile), holes, a token
    # with zero counts and one whose columns are all holes; D = 80 leaves a part block of dims.
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(4, 1, 20, D, 20, 150, seed=D)
    counts[1] = 0
    counts[3] = 150
    idx[2, 0, :] = -1
    out = sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts, tile_config=TWO_PASS[mode])
    assert rel_err(out, _reference(q, win, cmp, idx, 20, sink, 0.1, counts)) < 1.5e-2
    assert out[2].abs().max() == 0


def test_two_pass_values_rounds_over_a_wide_table():
    """The values pass reads its tiles' maxima and sums VALUES_MAX_TILES tiles a round (so a 1M-token
    cache costs its live tiles): with 2 tiles a round, 180 columns in tiles of 16 (12 tiles) take up
    to 6 rounds. Tokens with a short live prefix in the wide table (4, 33 and 100 compressed columns:
    2, 4 and 8 tiles with the window), all columns live, none live, and all holes: the same outputs
    as one round over every tile (within the fp32 sum order of the denominator) and the reference."""
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(6, 1, 16, 64, 20, 160, seed=5)
    counts[:, 0] = torch.tensor([4, 33, 100, 160, 0, 160], dtype=counts.dtype)
    idx[5, 0, :] = -1
    one_round = sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts,
                                         tile_config=dict(_two_pass(16, 16, 32, 32), VALUES_MAX_TILES=64))
    rounds = sparse_attn_paged_triton(q, win, cmp, idx, 20, sink, 0.1, counts,
                                      tile_config=dict(_two_pass(16, 16, 32, 32), VALUES_MAX_TILES=2))
    assert rel_err(rounds, one_round) < 1e-5
    assert rel_err(rounds, _reference(q, win, cmp, idx, 20, sink, 0.1, counts)) < 1.5e-2
    assert rounds[5].abs().max() == 0 and rounds[4].abs().max() > 0


@pytest.mark.parametrize("tokens, columns, expected", [
    (1, 640, "small"), (1, 1152, "live"), (2, 384, "two_pass"), (3, 640, "two_pass"), (4, 128, "two_pass"),
    (8, 640, "two_pass"), (64, 1152, "two_pass"),
])
def test_decode_config_dispatch(tokens, columns, expected):
    # Split-K for one token (32 columns per split up to 1024 columns; past that, 64 for a token with
    # more than 1024 live), two-pass from 2.
    configs = dict(small=DECODE_CONFIG_SMALL, live=DECODE_CONFIG_LIVE, two_pass=DECODE_CONFIG_TWO_PASS)
    assert decode_config(tokens, columns) == configs[expected]


def test_two_pass_any_query_count():
    # Every query token is independent, so M > 1 (and no counts, no window) works too.
    q, win, cmp, idx, sink, _ = sparse_attn_inputs(2, 3, 16, 64, 0, 40, seed=5)
    out = sparse_attn_paged_triton(q, win, cmp, idx, 0, sink, 0.1, tile_config=TWO_PASS["tiles of 16, 32-wide slices, 32 output dims"])
    assert rel_err(out, _reference(q, win, cmp, idx, 0, sink, 0.1, None)) < 1.5e-2


GPU_DECODE = [
    dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=96, MERGE="kernel", PDL=True, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=128, MERGE="kernel", PDL=True, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_T=64, COLS_PER_SPLIT=128, MERGE="kernel", PDL=True, num_warps=4, num_stages=1),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", range(len(GPU_DECODE)))
@pytest.mark.parametrize("ratio", [4, 128, 0])
def test_decode_split_widths_full_dims(cfg, ratio):
    case = sparse_decode_case(ratio, 8, 32767, "cuda", seed=8 + ratio)
    out = torch.full_like(case.q, float("nan"))
    out.copy_(sparse_attn_paged_triton(*case.args(), tile_config=GPU_DECODE[cfg]))
    ref = _reference(case.q, case.win_pool, case.cmp_pool, case.idx, WINDOW, case.sink, case.scale, case.counts)
    assert not out.isnan().any() and rel_err(out, ref) < 1e-2


GPU_TWO_PASS = [
    dict(DECODE_CONFIG_TWO_PASS),
    _two_pass(32, 32, 64, 128),
    _two_pass(64, 64, 256, 64, warps=8),
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", range(len(GPU_TWO_PASS)))
@pytest.mark.parametrize("ratio", [4, 128, 0])
@pytest.mark.parametrize("B", [1, 8])
def test_two_pass_decode_full_dims(cfg, ratio, B):
    case = sparse_decode_case(ratio, B, 32767, "cuda", seed=B + ratio)
    out = torch.full_like(case.q, float("nan"))
    out.copy_(sparse_attn_paged_triton(*case.args(), tile_config=GPU_TWO_PASS[cfg]))
    ref = _reference(case.q, case.win_pool, case.cmp_pool, case.idx, WINDOW, case.sink, case.scale, case.counts)
    assert not out.isnan().any() and rel_err(out, ref) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("H", [16, 20, 128])
def test_two_pass_decode_head_counts(H):
    # 20 and 16 heads leave most of a 64-head block masked; 128 heads are two blocks. Top-k 1024 (Pro).
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(8, 1, H, 512, 128, 1024, device="cuda", seed=H)
    counts[0] = 0
    counts[1] = 1000
    out = sparse_attn_paged_triton(q, win, cmp, idx, 128, sink, 512 ** -0.5, counts,
                                   tile_config=DECODE_CONFIG_TWO_PASS)
    assert rel_err(out, _reference(q, win, cmp, idx, 128, sink, 512 ** -0.5, counts)) < 1e-2


@pytest.mark.gpu
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("B", [1, 8])
def test_decode_rounds_over_a_wide_table_full_dims(B, packed):
    """The production decode over a table as wide as a 128K-token HCA cache's (128 window + 4096
    compressed columns): at B1 the split-K kernel's 66 splits of 64 columns merge in rounds of 32
    (MERGE_MAX_SPLITS), at B8 the two-pass values read 66 tiles' maxima and sums in rounds of 32
    (VALUES_MAX_TILES), over bf16 and packed fp8 rows. Live prefixes short (a 2K context in the wide
    cache), long and zero, against the fp32 torch reference over the same (unpacked) rows."""
    from v4serve.ops.kv_pack import pack_rows, unpack_rows

    q, win, cmp, idx, sink, counts = sparse_attn_inputs(B, 1, 64, 512, 128, 4096, device="cuda", seed=B)
    counts[:, 0] = torch.tensor([3500, 16, 4096, 0, 700, 1, 2047, 3000][:B], dtype=counts.dtype)
    kwargs = {}
    if packed:
        fmt = "fp8_e8m0_b64_rope64"
        win, cmp = pack_rows(win, fmt), pack_rows(cmp, fmt)
        kwargs = dict(row_format=fmt)
        win_ref, cmp_ref = unpack_rows(win, fmt, 512, impl="torch"), unpack_rows(cmp, fmt, 512, impl="torch")
    else:
        win_ref, cmp_ref = win, cmp
    out = sparse_attn_paged(q, win, cmp, idx, 128, sink, 512 ** -0.5, counts, impl="triton", **kwargs)
    ref = _reference(q, win_ref, cmp_ref, idx, 128, sink, 512 ** -0.5, counts)
    assert not out.isnan().any() and rel_err(out, ref) < 1e-2


def _needs_sm90():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised prefill kernel is built for sm_90")


WS_CONFIGS = [
    PREFILL_CONFIG_WS,
    dict(KERNEL="ws", BLOCK_T=32, KV_STAGES=4),
    dict(KERNEL="ws", BLOCK_T=16, KV_STAGES=3),
    dict(KERNEL="ws", BLOCK_T=64, KV_STAGES=2, COLS_PER_SPLIT=64),  # decode (M = 1): splits + merge
    dict(KERNEL="ws", BLOCK_T=32, KV_STAGES=4, COLS_PER_SPLIT=80),  # splits that end mid-tile
]


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", range(len(WS_CONFIGS)))
@pytest.mark.parametrize("B,M,H,n_window,K", [
    (2, 5, 64, 128, 512),    # the production head count, top-k not a multiple of the tile
    (1, 3, 20, 100, 300),    # 20 heads: one partly masked head block
    (1, 300, 128, 50, 77),   # 600 work items: each persistent program walks several tokens
    (3, 2, 16, 0, 40),       # no window columns
    (8, 1, 64, 128, 512),    # decode B8
    (3, 1, 128, 128, 200),   # decode, two head blocks
])
def test_ws_kernel_matches_reference(cfg, B, M, H, n_window, K):
    _needs_sm90()
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(B, M, H, 512, n_window, K, device="cuda", seed=M + H)
    counts[0, 0] = 0  # only window columns (none at all when n_window is 0)
    idx[-1, -1, :] = -1  # a token whose columns are all holes
    for cnt in (counts, None):
        out = torch.full_like(q, float("nan"))
        out.copy_(sparse_attn_paged_triton(q, win, cmp, idx, n_window, sink, 512**-0.5, cnt,
                                           tile_config=WS_CONFIGS[cfg]))
        ref = _reference(q, win, cmp, idx, n_window, sink, 512**-0.5, cnt)
        assert not out.isnan().any() and rel_err(out, ref) < 1e-2
        assert out[-1, -1].abs().max() == 0


@pytest.mark.gpu
def test_ws_prefill_is_production_on_sm90():
    """The production prefill on sm_90 (Triton 3.6, D = 512) is the warp-specialised kernel, and the
    `tl` kernel agrees with it at a PR shape."""
    _needs_sm90()
    if triton_at_least(3, 7):
        pytest.skip("the warp-specialised kernel is production under Triton 3.6 only")
    assert prefill_config(torch.device("cuda"), 512) == PREFILL_CONFIG_WS
    case = sparse_prefill_case(128, 256, 8192, "cuda", seed=3)
    ws = sparse_attn_paged_triton(*case.args())
    tl_out = sparse_attn_paged_triton(*case.args(), tile_config=PREFILL_CONFIG)
    assert rel_err(ws, tl_out) < 1e-2


@pytest.mark.parametrize("capability,head_dim,triton_37,expected", [
    ((9, 0), 512, False, "ws"),     # the timed configuration: the Gluon kernel
    ((9, 0), 128, False, 90),       # another head dim: the `tl` kernel's sm_90 tiles
    ((9, 0), 512, True, 90),        # Triton >= 3.7: compiled by the codegen check, never run
    ((8, 0), 512, False, 80),
    ((12, 0), 512, False, 120),
])
def test_prefill_config_dispatch(monkeypatch, capability, head_dim, triton_37, expected):
    import v4serve.ops.sparse_attn_triton as sat
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(sat, "triton_at_least", lambda major, minor: triton_37)
    cfg = sat.prefill_config(torch.device("cuda"), head_dim)
    assert cfg == (sat.PREFILL_CONFIG_WS if expected == "ws" else sat.PREFILL_CONFIGS[expected])


def test_ws_kernel_rejects_other_head_dims():
    q, win, cmp, idx, sink, counts = sparse_attn_inputs(1, 2, 4, 64, 8, 8, seed=5)
    with pytest.raises(ValueError, match="takes D = 512, got 64"):
        sparse_attn_paged_triton(q, win, cmp, idx, 8, sink, 0.125, counts, tile_config=PREFILL_CONFIG_WS)
