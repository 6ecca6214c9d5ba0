"""Tile-config sweep for the kernels (development tool: `python -m v4serve.bench.kernel_configs [filter]`).

Times candidate configs at a few PR shapes, checks each against the production config's output
(relative error), and prints one line per (shape, config), fastest first.
"""

import sys

from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import sparse_decode_case, sparse_prefill_case
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

PREFILL_CANDIDATES = [  # the production config first (the error reference)
    dict(BLOCK_H=64, BLOCK_T=64, num_warps=8, num_stages=1),
    dict(BLOCK_H=64, BLOCK_T=32, num_warps=8, num_stages=1),
    dict(BLOCK_H=32, BLOCK_T=64, num_warps=4, num_stages=1),
    dict(BLOCK_H=32, BLOCK_T=64, num_warps=4, num_stages=2),
    dict(BLOCK_H=32, BLOCK_T=32, num_warps=4, num_stages=2),
    dict(BLOCK_H=32, BLOCK_T=64, num_warps=8, num_stages=1),
    dict(BLOCK_H=16, BLOCK_T=64, num_warps=4, num_stages=2),
]
_W4 = dict(BLOCK_T=32, num_warps=4, num_stages=2)
DECODE_CANDIDATES = [  # the previous production config first (the error reference)
    dict(BLOCK_H=16, COLS_PER_SPLIT=32, MERGE="kernel", **_W4),
    dict(BLOCK_H=16, COLS_PER_SPLIT=32, MERGE="kernel", PDL=True, **_W4),
    dict(BLOCK_H=16, COLS_PER_SPLIT=64, MERGE="kernel", **_W4),
    dict(BLOCK_H=16, COLS_PER_SPLIT=64, MERGE="kernel", PDL=True, **_W4),
    dict(BLOCK_H=16, COLS_PER_SPLIT=64, MERGE="kernel", PDL=True, BLOCK_T=32, num_warps=4, num_stages=3),
    dict(BLOCK_H=16, COLS_PER_SPLIT=64, MERGE="kernel", PDL=True, BLOCK_T=64, num_warps=4, num_stages=1),
    dict(BLOCK_H=64, COLS_PER_SPLIT=64, MERGE="kernel", PDL=True, BLOCK_T=64, num_warps=8, num_stages=1),
    dict(BLOCK_H=32, COLS_PER_SPLIT=32, MERGE="kernel", PDL=True, **_W4),
    dict(BLOCK_H=16, COLS_PER_SPLIT=32, MERGE="kernel", PDL=True, BLOCK_T=32, num_warps=2, num_stages=2),
    dict(BLOCK_H=16, COLS_PER_SPLIT=16, MERGE="kernel", PDL=True, BLOCK_T=16, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, COLS_PER_SPLIT=None, **_W4),
    dict(BLOCK_H=16, COLS_PER_SPLIT=64, MERGE="fused", **_W4),
]


def _sweep(label, run, candidates):
    ref = run(candidates[0]).float()
    results = []
    for cfg in candidates:
        try:
            out = run(cfg).float()
            err = float((out - ref).norm() / ref.norm())
            us = do_bench_cudagraph(lambda: run(cfg), rep=30, return_mode="median") * 1e3
            results.append((us, err, cfg))
        except Exception as e:  # a config that does not compile is reported, not fatal
            results.append((float("inf"), float("nan"), {**cfg, "error": type(e).__name__}))
    for us, err, cfg in sorted(results, key=lambda r: r[0]):
        print(f"{label:32s} {us:10.2f} µs  err {err:.1e}  {cfg}")


def main() -> int:
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    for name, case in [("prefill r4 S8192", sparse_prefill_case(4, 8192, 0, "cuda")),
                       ("prefill r128 S8192", sparse_prefill_case(128, 8192, 0, "cuda")),
                       ("prefill r0 S8192", sparse_prefill_case(0, 8192, 0, "cuda"))]:
        if only not in name:
            continue
        _sweep(name, lambda cfg, c=case: sparse_attn_paged_triton(*c.args(), tile_config=cfg), PREFILL_CANDIDATES)
        del case
    for name, case in [("decode r4 B1", sparse_decode_case(4, 1, 32767, "cuda")),
                       ("decode r128 B1", sparse_decode_case(128, 1, 32767, "cuda")),
                       ("decode r0 B1", sparse_decode_case(0, 1, 32767, "cuda")),
                       ("decode r4 B8", sparse_decode_case(4, 8, 32767, "cuda")),
                       ("decode r128 B8", sparse_decode_case(128, 8, 32767, "cuda")),
                       ("decode r0 B8", sparse_decode_case(0, 8, 32767, "cuda"))]:
        if only not in name:
            continue
        _sweep(name, lambda cfg, c=case: sparse_attn_paged_triton(*c.args(), tile_config=cfg), DECODE_CANDIDATES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
