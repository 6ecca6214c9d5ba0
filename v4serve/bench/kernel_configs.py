"""Tile-config sweep for the kernels (development tool: `python -m v4serve.bench.kernel_configs [filter]`).

Times candidate configs at a few PR shapes, checks each against the production config's output
(relative error), and prints one line per (shape, config) in the candidates' order.
"""

import sys

from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import expert_fetch_case, sparse_decode_case, sparse_prefill_case
from v4serve.formats import row_format
from v4serve.ops.expert_fetch_triton import expert_fetch_triton
from v4serve.ops.kv_pack import pack_rows
from v4serve.ops.sparse_attn_triton import (
    DECODE_CONFIG_LARGE,
    DECODE_CONFIG_SMALL,
    DECODE_CONFIG_TWO_PASS,
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


def _two_pass(block_t=64, block_k=128, block_dv=32, score_warps=4, score_stages=3, value_stages=3, **more):
    return dict(DECODE_CONFIG_TWO_PASS, BLOCK_T=block_t, BLOCK_K=block_k, BLOCK_DV=block_dv,
                SCORES=dict(num_warps=score_warps, num_stages=score_stages),
                VALUES=dict(num_warps=4, num_stages=value_stages), **more)


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


# Over packed fp8 rows (issue 17): split-K at B1 with more heads per program (each program
# dequantizes its rows once for its heads: 64 heads = once per row), QK_SLICE 64 / 128; two-pass
# at B8 with shallower pipelines (the packed gather is 16-byte loads of codes, then scales).
PACKED_DECODE_CANDIDATES = [
    None,
    *(dict(_decode(h, cols, 32, warps, 2), QK_SLICE=sl)
      for h, cols, warps, sl in ((16, 32, 4, 128), (32, 32, 8, 128), (64, 32, 8, 128), (64, 64, 8, 128),
                                 (32, 64, 8, 64), (64, 32, 8, 64))),
    _two_pass(block_k=64, score_stages=2, value_stages=2),
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


def _label(cfg) -> str:
    if cfg is None:
        return "production"
    short = dict(BLOCK_H="h", COLS_PER_SPLIT="c", BLOCK_T="t", num_warps="w", num_stages="s", KV_STAGES="ring",
                 BLOCK_K="k", BLOCK_DV="dv", VALUE_BLOCK_H="vh")
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
PACKED_FORMAT = "fp8_e8m0_b64_rope64"


def _packed_run(case):
    q, win, cmp, idx, n_window, sink, scale, counts = case.args()
    pw, pc, fmt = pack_rows(win, PACKED_FORMAT), pack_rows(cmp, PACKED_FORMAT), row_format(PACKED_FORMAT)
    return lambda cfg: sparse_attn_paged_triton(q, pw, pc, idx, n_window, sink, scale, counts, tile_config=cfg,
                                                row_format=fmt)


def main() -> int:
    only = sys.argv[1] if len(sys.argv) > 1 else ""
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
            _sweep(name, _packed_run(sparse_decode_case(*args, "cuda")), PACKED_DECODE_CANDIDATES)
    for name, n in FETCH_SHAPES.items():
        if only in name:
            _sweep(name, _fetch_run(n), FETCH_CANDIDATES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
