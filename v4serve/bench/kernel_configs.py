"""Tile-config sweep for the kernels (development tool: `python -m v4serve.bench.kernel_configs`).

Times candidate configs at a few PR shapes, checks each against the production config's output
(relative error), and prints one line per (shape, config), fastest first.
"""

import sys

import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import gated_pool_case, sparse_decode_case, sparse_prefill_case
from v4serve.ops.gated_pool_triton import gated_pool_triton
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton

PREFILL_CANDIDATES = [
    dict(BLOCK_H=64, BLOCK_T=32, num_warps=8, num_stages=2),
    dict(BLOCK_H=64, BLOCK_T=32, num_warps=8, num_stages=3),
    dict(BLOCK_H=64, BLOCK_T=64, num_warps=8, num_stages=2),
    dict(BLOCK_H=64, BLOCK_T=16, num_warps=4, num_stages=3),
    dict(BLOCK_H=64, BLOCK_T=32, num_warps=4, num_stages=2),
]
DECODE_CANDIDATES = [
    dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=64, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=32, num_warps=4, num_stages=2),
    dict(BLOCK_H=16, BLOCK_T=16, COLS_PER_SPLIT=32, num_warps=4, num_stages=2),
    dict(BLOCK_H=32, BLOCK_T=32, COLS_PER_SPLIT=64, num_warps=4, num_stages=2),
    dict(BLOCK_H=64, BLOCK_T=32, COLS_PER_SPLIT=64, num_warps=8, num_stages=2),
    dict(BLOCK_H=16, BLOCK_T=64, COLS_PER_SPLIT=128, num_warps=4, num_stages=2),
]
GATED_CANDIDATES = [dict(BLOCK_R=128, BLOCK_D=d, num_warps=w) for d in (8, 16, 32) for w in (1, 2, 4)]


def _sweep(label, run, candidates):
    ref = run(candidates[0]).float()
    results = []
    for cfg in candidates:
        try:
            out = run(cfg).float()
            err = float((out - ref).norm() / ref.norm())
            us = do_bench_cudagraph(lambda: run(cfg), rep=50, return_mode="median") * 1e3
            results.append((us, err, cfg))
        except Exception as e:  # a config that does not compile is reported, not fatal
            results.append((float("inf"), float("nan"), {**cfg, "error": type(e).__name__}))
    for us, err, cfg in sorted(results, key=lambda r: r[0]):
        print(f"{label:32s} {us:10.2f} µs  err {err:.1e}  {cfg}")


def main() -> int:
    for name, case in [("prefill r4 S8192", sparse_prefill_case(4, 8192, 0, "cuda")),
                       ("prefill r0 S8192", sparse_prefill_case(0, 8192, 0, "cuda"))]:
        _sweep(name, lambda cfg, c=case: sparse_attn_paged_triton(*c.args(), prefill_config=cfg), PREFILL_CANDIDATES)
        del case
    for name, case in [("decode r4 B1", sparse_decode_case(4, 1, 32767, "cuda")),
                       ("decode r4 B8", sparse_decode_case(4, 8, 32767, "cuda")),
                       ("decode r0 B1", sparse_decode_case(0, 1, 32767, "cuda"))]:
        _sweep(name, lambda cfg, c=case: sparse_attn_paged_triton(*c.args(), decode_config=cfg), DECODE_CANDIDATES)
    for B, R, D in [(1, 128, 512), (8, 128, 512), (1, 8, 512)]:
        kv, score = gated_pool_case(B, R, D, "cuda")
        cands = [dict(c, BLOCK_R=min(R, c["BLOCK_R"])) for c in GATED_CANDIDATES]
        _sweep(f"gated_pool B{B} R{R} D{D}", lambda cfg: gated_pool_triton(kv, score, torch.float32, cfg), cands)
    return 0


if __name__ == "__main__":
    sys.exit(main())
