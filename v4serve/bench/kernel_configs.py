"""Tile-config sweep for the kernels (development tool: `python -m v4serve.bench.kernel_configs [filter]`).

Times candidate configs at a few PR shapes, checks each against the production config's output
(relative error), and prints one line per (shape, config) in the candidates' order.
"""

import sys

from triton.testing import do_bench_cudagraph

from v4serve.bench import moe_configs
from v4serve.bench.shapes import expert_fetch_case, indexer_case, sparse_decode_case, sparse_prefill_case
from v4serve.formats import row_format
from v4serve.ops.expert_fetch_triton import expert_fetch_triton
from v4serve.ops.indexer_triton import index_scores_triton
from v4serve.ops.kv_pack import pack_rows, unpack_rows
from v4serve.ops.sparse_attn_triton import (
    DECODE_CONFIG_LARGE,
    DECODE_CONFIG_LARGE_PACKED,
    DECODE_CONFIG_LIVE_PACKED,
    DECODE_CONFIG_SMALL,
    DECODE_CONFIG_SMALL_PACKED,
    DECODE_CONFIG_TWO_PASS,
    DECODE_CONFIG_TWO_PASS_PACKED,
    PREFILL_CONFIG,
    sparse_attn_paged_triton,
)

# None = the production config (decode_config / prefill_config pick it per shape); it comes first
# (the error reference) and last (the same config timed twice shows the run's noise).
PREFILL_CANDIDATES = [
    None,
    PREFILL_CONFIG,  # the `tl` kernel's sm_90 tiles (production before the warp-specialised kernel)
    dict(KERNEL="ws", BLOCK_T=32, KV_STAGES=4),
    None,
]


def _decode(h, cols, block_t, warps, stages):
    return dict(BLOCK_H=h, COLS_PER_SPLIT=cols, BLOCK_T=block_t, num_warps=warps, num_stages=stages,
                MERGE="kernel", PDL=True)


def _two_pass(block_t=64, block_k=128, block_dv=32, score_warps=4, score_stages=3, value_stages=3, value_warps=4,
              **more):
    return dict(DECODE_CONFIG_TWO_PASS, BLOCK_T=block_t, BLOCK_K=block_k, BLOCK_DV=block_dv,
                SCORES=dict(num_warps=score_warps, num_stages=score_stages),
                VALUES=dict(num_warps=value_warps, num_stages=value_stages), **more)


DECODE_CANDIDATES = [
    None,
    DECODE_CONFIG_SMALL,  # split-K, 32 columns per split (production at B1 up to 1024 columns)
    DECODE_CONFIG_LARGE,  # split-K, 64 columns per split (production at B1 past 1024 columns)
    DECODE_CONFIG_TWO_PASS,  # production at B >= 2
    _two_pass(block_k=64, score_stages=4, value_stages=4),
    _two_pass(block_k=64, score_stages=4, block_dv=16),
    _two_pass(block_k=128, score_stages=3),
    None,
]


# Over packed fp8 rows (issue 17), B1 (split-K) and B8 (two-pass) apart. "bf16 rows" times the
# production bf16 launch over the same values unpacked (the bar the packed rows must meet, within
# 5%). Measured and dropped (session 11's sweep, r4, µs; production then 7.83 at B1, 13.29 at B8):
# B1 16-column splits 12.44, 64 heads a program 10.84, 64-column splits with 2 stages 11.33, the
# two-pass kernels 13.03, S from fp16 codes with the block scales on the partial scores 9.16 (at
# B8 21.13: deleted); B8 the scores' K loop 14.65, 16-warp scores 14.60, 32-column tiles 19.72,
# prefetch with 16-warp scores 16.17. Session 13's first call (r4, production 13.36 / 13.35 at B8,
# bf16 rows 9.92 / 9.80): tail programs 14.60, values over 8 warps 15.39, 64 dims a values
# program 23.89, 16 dims 17.43, prefetch 13.62: all dropped from the list (still selectable).
PACKED_DECODE_B1_CANDIDATES = [
    None,  # split-K, whole [32, 512] tile dequantized once, 16 heads, 4 warps, 1 stage, bf16 operand layout
    "bf16 rows",
    dict(DECODE_CONFIG_SMALL_PACKED, num_warps=8),  # production until session 13 (r4: 7.02 / 7.20 against 4 warps' 6.79)
    None,
]
# Session 14 (issue 17, branch packed-b8): the values pass stores each dequantized tile to shared
# memory as wgmma's B operand, which needs fence.proxy.async (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC.S) and a
# barrier before every tile's wgmma; these variants have none: 32-head values programs (mma.sync; the
# tile through the bf16 operand boundary: ldmatrix, kWidth 2), and the tile as the left operand of the
# transposed dot (out^T = kv^T p^T; wgmma reads A from registers) at 64 dims for 32 or 64 heads. The
# whole-tile scores pass over 4 warps: one warpgroup of m64n64 wgmma steps, where 8 warps run two
# m64n32 warpgroups that each read all of Q (the A operand) from shared memory at every k step.
# Measured in session 16 (`sweeps-b`): none faster than production (best 13.59 against 13.35 µs at r4),
# so the sweep no longer runs them; their tile-config keys stay in the launcher (VALUE_BLOCK_H=32,
# KV_OPERAND=1 / 2, BLOCK_DV=64, SCORES=dict(num_warps=4, num_stages=1)) and their GPU tests in
# tests/ops/test_packed_kernels_gpu.py.
# Session 22: the two passes in Gluon. Values (ops/sparse_attn_values_gluon.py): the tiles' bytes, p and
# m_j in a cp.async ring, the dequantized tile as wgmma's register operand of the transposed dot, each
# tile's MMA behind the next tile's conversion; "2wg": a token's tiles alternating between two
# warp-specialised warpgroups (a ring each). Scores (ops/sparse_attn_scores_gluon.py): each 64-channel
# block's MMA issued while the next block dequantizes. Measured (session 23, H200, r4 B8): correct, but
# slower than production (values gluon 16.4, 2wg 13.8, scores gluon 13.4 against 13.1-13.4 µs); kept as
# the sweep's variants for the next redesign (docs/performance.md "Session 23: measured").
PACKED_B8_VARIANTS = {
    "values gluon": dict(DECODE_CONFIG_TWO_PASS_PACKED, VALUES_KERNEL="gluon"),
    "values gluon 2wg": dict(DECODE_CONFIG_TWO_PASS_PACKED, VALUES_KERNEL="gluon", VALUE_WARPGROUPS=2),
    "scores gluon": dict(DECODE_CONFIG_TWO_PASS_PACKED, SCORES_KERNEL="gluon"),
    "both gluon": dict(DECODE_CONFIG_TWO_PASS_PACKED, SCORES_KERNEL="gluon", VALUES_KERNEL="gluon"),
    "both gluon 2wg": dict(DECODE_CONFIG_TWO_PASS_PACKED, SCORES_KERNEL="gluon", VALUES_KERNEL="gluon",
                           VALUE_WARPGROUPS=2),
}
PACKED_DECODE_B8_CANDIDATES = [
    None,  # two-pass: whole-tile scores over 8 warps (sm_90); the values pass dequantizes its dims again
    "bf16 rows",
    # the scores pass writes its dequantized tiles as bf16 rows; the values pass is the bf16 loop over them
    dict(DECODE_CONFIG_TWO_PASS_PACKED, UNPACKED_ROWS=True),
    dict(KERNEL="unpack", INNER=DECODE_CONFIG_TWO_PASS),  # every column unpacked first, then the bf16 launch
    # Session 22 (issue 17): the two passes in Gluon
    *PACKED_B8_VARIANTS.values(),
    "bf16 rows",
    None,
]


# Offloaded-expert fetch (ops/expert_fetch_triton.py): how many programs read the host link, and
# their chunk. Fewer programs leave more SMs to the resident experts computing beside the fetch.
FETCH_CANDIDATES = [
    None,
    *(dict(programs=p) for p in (8, 16, 32, 128, 264)),
    dict(programs=64, BLOCK=4096, num_warps=8),
    dict(programs=32, BLOCK=4096, num_warps=8),
    None,
]
FETCH_SHAPES = {f"fetch flash E{n}": n for n in (1, 6)}


def _fetch_run(n):
    hosts, devices, count, slots, rows = expert_fetch_case("flash", n, "cuda")
    return lambda cfg: [expert_fetch_triton(h, d, count, slots, rows, 4, cfg) for h, d in zip(hosts, devices)] and devices[0]


# Indexer scores (issue 17, ops/indexer_triton.py): prefill query blocks of 4 or 2 queries (N = 256 or
# 128 columns of (query, head)), 64 or 128 keys per block, a deeper key pipeline, 8 warps splitting
# N, and over packed keys the decode-first variant (every key decoded once into a bf16 slab, then
# the bf16 kernel); decode: keys per program and blocks per split.
INDEXER_PREFILL_CANDIDATES = [
    None,
    dict(BLOCK_Q=4, BLOCK_T=64, num_warps=4, num_stages=3),
    dict(BLOCK_Q=2, BLOCK_T=64, num_warps=4, num_stages=2),
    dict(BLOCK_Q=4, BLOCK_T=64, num_warps=8, num_stages=2),
    dict(BLOCK_Q=4, BLOCK_T=128, num_warps=8, num_stages=2),
    dict(BLOCK_Q=4, BLOCK_T=64, num_warps=4, num_stages=2, DECODE_FIRST=True),
    None,
]
INDEXER_DECODE_CANDIDATES = [
    None,
    dict(BLOCK_Q=1, BLOCK_T=64, BLOCKS_PER_SPLIT=1, num_warps=4, num_stages=2),
    dict(BLOCK_Q=1, BLOCK_T=32, BLOCKS_PER_SPLIT=1, num_warps=4, num_stages=1),
    dict(BLOCK_Q=1, BLOCK_T=128, BLOCKS_PER_SPLIT=1, num_warps=8, num_stages=1),
    dict(BLOCK_Q=1, BLOCK_T=64, BLOCKS_PER_SPLIT=2, num_warps=4, num_stages=2),
    None,
]
# The decode rows "T32768 n540": a 2K-token context in a 128K cache (max_model_len 131072 at ratio 4):
# 540 visible keys in a 32768-column table, the rest unallocated (-1); "T540 n540": the same context in
# a table of its own width (what the wide table's dead blocks cost on top).
INDEXER_SHAPES = {f"indexer {name} {keys}": (args, keys) for name, args in (
    ("prefill S2048@28672", (1, 2048, 28672)), ("decode B1", (1, 1, 32767)), ("decode B8", (8, 1, 32767)),
    ("decode B1 T32768 n540", (1, 1, 2159, 32768)), ("decode B8 T32768 n540", (8, 1, 2159, 32768)),
    ("decode B8 T540 n540", (8, 1, 2159)))
    for keys in ("bf16", "fp4")}


def _indexer_run(args, keys):
    B, S, start, *columns = args
    q, w, k_pool, key_rows, n_visible = indexer_case(B, S, start, "cuda", columns=columns[0] if columns else None)
    fmt = row_format("fp4_e8m0_b32") if keys == "fp4" else None
    pool = k_pool if fmt is None else pack_rows(k_pool, fmt)
    return lambda cfg: index_scores_triton(q, w, pool, key_rows, n_visible, config=cfg, row_format=fmt)


def _label(cfg) -> str:
    if cfg is None:
        return "production"
    if isinstance(cfg, str):
        return cfg
    short = dict(BLOCK_H="h", COLS_PER_SPLIT="c", BLOCK_T="t", num_warps="w", num_stages="s", KV_STAGES="ring",
                 BLOCK_K="k", BLOCK_DV="dv", VALUE_BLOCK_H="vh", FP8_CVT="cvt", TAIL_APART="tail_apart",
                 WHOLE_TILE="whole_tile", UNPACKED_ROWS="unpacked_rows", PREFETCH="prefetch", TAIL_PROGRAMS="tail_programs", BF16_OPERAND="bf16_operand", BLOCK_Q="q",
                 KV_OPERAND="kv_operand",
                 BLOCKS_PER_SPLIT="split", DECODE_FIRST="decode_first")
    if cfg.get("KERNEL") == "unpack":
        return "unpack columns, then the production bf16 launch (unpack)"
    launch = lambda v: f"{v['num_warps']}w{v['num_stages']}s" if isinstance(v, dict) else v  # noqa: E731
    return " ".join(f"{short.get(k, k)}={launch(v)}" for k, v in cfg.items() if k not in ("MERGE", "PDL", "KERNEL")) + (
        f" ({cfg['KERNEL']})" if "KERNEL" in cfg else "")


def _sweep(label, run, candidates):
    """One line per candidate, in the list's order: median µs (do_bench_cudagraph) and the relative
    error against the first candidate's output."""
    ref = run(candidates[0]).float()
    for i, cfg in enumerate(candidates):
        try:
            out = run(cfg).float()
            err = float((out - ref).norm() / ref.norm())
            us = do_bench_cudagraph(lambda: run(cfg), rep=30, return_mode="median") * 1e3
            print(f"{label:20s} #{i:<2d} {us:9.2f} µs  err {err:.1e}  {_label(cfg)}", flush=True)
        except Exception as e:  # a config that does not compile is reported, not fatal
            print(f"{label:20s} #{i:<2d}    failed  {type(e).__name__}: {str(e)[:80]}  {_label(cfg)}", flush=True)


PREFILL_SHAPES = {"prefill r4 S8192": (4, 8192, 0), "prefill r128 S8192": (128, 8192, 0),
                  "prefill r0 S8192": (0, 8192, 0)}
# B1 and B8 are the PR's; B2 and B4 show where the split-K / two-pass dispatch should switch.
DECODE_SHAPES = {f"decode r{r} B{B}": (r, B, 32767) for B in (1, 2, 4, 8) for r in (4, 128, 0)}
PACKED_DECODE_SHAPES = {f"decode fp8kv r{r} B{B}": (r, B, 32767) for B in (1, 8) for r in (4, 128, 0)}
# B1 HCA rows of a 128K-token cache (max_model_len 131072: 128 + 1024 columns): a 2K context (144 live
# columns, the rest past the live bound) and a full one (every column live); split-K SMALL, LARGE and
# the split width by live columns (production).
WIDE_DECODE_SHAPES = {"decode wide r128 B1 pos2047 C1152": (128, 1, 2047, 1024),
                      "decode wide r128 B1 pos131071 C1152": (128, 1, 131071, 1024),
                      "decode wide r128 B1 pos2047 C194": (128, 1, 2047, 66)}  # max_model_len 8448: the reference
# Production (None) is DECODE_CONFIG_LIVE(_PACKED): the split width by each token's live columns.
WIDE_DECODE_CANDIDATES = [None, DECODE_CONFIG_SMALL, DECODE_CONFIG_LARGE, None]
WIDE_PACKED_DECODE_CANDIDATES = [None, DECODE_CONFIG_SMALL_PACKED, DECODE_CONFIG_LARGE_PACKED,
                                 dict(DECODE_CONFIG_LIVE_PACKED, num_warps=8), "bf16 rows", None]
PACKED_FORMAT = "fp8_e8m0_b64_rope64"
# The compaction before prefill over packed rows (ops/kv_compact_triton.py): its launch entries.
KV_COMPACT_SHAPES = {"kv compact r4 S2048": (4, 2048, 0), "kv compact r4 S8192": (4, 8192, 0),
                     "kv compact r128 S8192": (128, 8192, 0)}
KV_COMPACT_CANDIDATES = [None, dict(SKIP_SEEN=False), dict(BLOCK_E=1024), dict(BLOCK_E=4096), None]


def _packed_run(case):
    """run(cfg) over the case's pools packed; cfg "bf16 rows": the production bf16 launch over the
    packed rows unpacked (the same values)."""
    q, win, cmp, idx, n_window, sink, scale, counts = case.args()
    pw, pc, fmt = pack_rows(win, PACKED_FORMAT), pack_rows(cmp, PACKED_FORMAT), row_format(PACKED_FORMAT)
    uw, uc = unpack_rows(pw, fmt, q.shape[-1]), unpack_rows(pc, fmt, q.shape[-1])

    def run(cfg):
        if cfg == "bf16 rows":
            return sparse_attn_paged_triton(q, uw, uc, idx, n_window, sink, scale, counts)
        return sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, scale, counts, tile_config=cfg,
                                        row_format=fmt)

    return run


def _pass_times(label, case):
    """The two passes of the B >= 2 launch timed apart (CUDA-graph medians), bf16 rows against packed
    rows, each at its production tiles: which pass holds the packed rows' extra time."""
    import torch

    from v4serve.ops._dispatch import fp8_conversion_supported, pdl_supported
    from v4serve.ops.kv_pack_triton import packed_constexprs
    from v4serve.ops.sparse_attn_triton import LOG2E, decode_config
    from v4serve.ops.sparse_attn_two_pass import two_pass_scores, two_pass_values

    q, win, cmp, idx, n_window, sink, scale, counts = case.args()
    fmt, D = row_format(PACKED_FORMAT), q.shape[-1]
    pw, pc = pack_rows(win, fmt), pack_rows(cmp, fmt)
    T = q.shape[0] * q.shape[1]
    qt, it, ct, sink = q.reshape(T, -1, D), idx.reshape(T, -1), counts.reshape(T), sink.float()
    out, pdl = torch.empty_like(qt), pdl_supported(q.device)
    packed = dict(PACKED=True, **packed_constexprs(fmt, D), PK_FP8_CVT=fp8_conversion_supported(q.device))
    times, qk = [], scale * LOG2E
    packed_cfg = decode_config(T, it.shape[1], True, q.device)
    for w, c, pk, cfg in ((unpack_rows(pw, fmt, D), unpack_rows(pc, fmt, D), {}, decode_config(T, it.shape[1])),
                          (pw, pc, packed, packed_cfg), (pw, pc, packed, dict(packed_cfg, UNPACKED_ROWS=True))):
        scores = lambda: two_pass_scores(qt, w, c, it, ct, sink, n_window, qk, True, pdl, cfg, pk)  # noqa: E731
        p, m, l, rows = scores()
        values = lambda: two_pass_values(w, c, it, ct, sink, p, m, l, out, n_window, True, pdl, cfg, pk,  # noqa: E731
                                         rows)
        times += [do_bench_cudagraph(f, rep=30, return_mode="median") * 1e3 for f in (scores, values)]
    print(f"{label:20s} passes: scores {times[0]:.2f} (bf16 rows) / {times[2]:.2f} (packed) / {times[4]:.2f} "
          f"(packed, unpacked_rows) µs, values {times[1]:.2f} / {times[3]:.2f} / {times[5]:.2f} µs", flush=True)
    for name, cfg in PACKED_B8_VARIANTS.items():  # session 22's variants, each pass alone as above
        scores = lambda: two_pass_scores(qt, pw, pc, it, ct, sink, n_window, qk, True, pdl, cfg, packed)  # noqa: E731
        p, m, l, _ = scores()
        values = lambda: two_pass_values(pw, pc, it, ct, sink, p, m, l, out, n_window, True, pdl, cfg,  # noqa: E731
                                         packed)
        us = [do_bench_cudagraph(f, rep=30, return_mode="median") * 1e3 for f in (scores, values)]
        print(f"{label:20s} passes ({name}): scores {us[0]:.2f}, values {us[1]:.2f} µs", flush=True)


def _compact_run(case):
    """The renumbered columns (what every launch config must reproduce) of the case's compaction."""
    from v4serve.ops.kv_compact_triton import unpack_referenced_rows_triton

    q, win, cmp, idx, n_window, sink, scale, counts = case.args()
    pw, pc, fmt = pack_rows(win, PACKED_FORMAT), pack_rows(cmp, PACKED_FORMAT), row_format(PACKED_FORMAT)
    cols, ct = idx.reshape(-1, idx.shape[-1]), counts.reshape(-1)
    n_rows = pw.shape[0] + pc.shape[0]
    return lambda cfg: unpack_referenced_rows_triton(pw, pc, cols, n_window, fmt, q.shape[-1], q.dtype, ct, n_rows,
                                                     launch=cfg)[1]


def main() -> int:
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    if only.startswith("v41") or "NC16384" in only or "staged1M" in only or only.startswith(("full ", "cand ")):
        from v4serve.bench.v41_index_configs import sweep

        sweep(only)  # the V4.1 indexer's shapes (bench/v41_index_configs.py)
        return 0
    for name, args in PREFILL_SHAPES.items():
        if only in name:
            case = sparse_prefill_case(*args, "cuda")
            _sweep(name, lambda cfg, c=case: sparse_attn_paged_triton(*c.args(), tile_config=cfg), PREFILL_CANDIDATES)
    for name, args in DECODE_SHAPES.items():
        if only in name:
            case = sparse_decode_case(*args, "cuda")
            _sweep(name, lambda cfg, c=case: sparse_attn_paged_triton(*c.args(), tile_config=cfg), DECODE_CANDIDATES)
    for name, args in PACKED_DECODE_SHAPES.items():
        if only in name:
            candidates = PACKED_DECODE_B1_CANDIDATES if args[1] == 1 else PACKED_DECODE_B8_CANDIDATES
            case = sparse_decode_case(*args, "cuda")
            _sweep(name, _packed_run(case), candidates)
            if args[1] > 1:
                _pass_times(name, case)
    for name, (ratio, B, pos, columns) in WIDE_DECODE_SHAPES.items():
        packed_name = name.replace("wide", "wide fp8kv")
        if only in name or only in packed_name:
            case = sparse_decode_case(ratio, B, pos, "cuda", columns=columns)
        if only in name:
            _sweep(name, lambda cfg, c=case: sparse_attn_paged_triton(*c.args(), tile_config=cfg),
                   WIDE_DECODE_CANDIDATES)
        if only in packed_name:
            _sweep(packed_name, _packed_run(case), WIDE_PACKED_DECODE_CANDIDATES)
    for name, args in KV_COMPACT_SHAPES.items():
        if only in name:
            _sweep(name, _compact_run(sparse_prefill_case(*args, "cuda")), KV_COMPACT_CANDIDATES)
    for name, n in FETCH_SHAPES.items():
        if only in name:
            _sweep(name, _fetch_run(n), FETCH_CANDIDATES)
    for name, (args, keys) in INDEXER_SHAPES.items():
        if only in name:
            _sweep(name, _indexer_run(args, keys), INDEXER_DECODE_CANDIDATES if args[1] == 1 else INDEXER_PREFILL_CANDIDATES)
    moe_configs.sweep(only)  # the MXFP4 MoE layer ("moe flash c1", ...)
    from v4serve.bench import fp8_decode_configs

    fp8_decode_configs.sweep(only)  # FP8 linear decode variants ("fp8 decode flash wq_a M1", ...)
    fp8_decode_configs.sweep_swiglu(only)  # the shared expert's gate | up + SwiGLU, fused vs unfused
    from v4serve.bench import v41_attn_configs

    v41_attn_configs.sweep(only)  # V4.1's decode attention routes over two packed formats ("two-format decode B1")
    from v4serve.bench import mhc_configs

    mhc_configs.sweep(only)  # the mHC mixer + coefficients epilogue ("mhc coeffs T1", ...)
    from v4serve.bench import index_topk_configs

    index_topk_configs.sweep(only)  # the indexer's top-k against torch.sort ("index topk B1 T2048 k512", ...)
    return 0


if __name__ == "__main__":
    sys.exit(main())
