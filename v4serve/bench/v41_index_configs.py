"""Tile-config sweep of the V4.1 indexer kernels (`python -m v4serve.bench.kernel_configs v41`):
each candidate at a few of the PR's shapes, timed like bench/kernels.py (CUDA-graph median) and
compared with the production launch's output (the fraction of bit-equal scores; every candidate
sums the heads in its own order only in the rows kernel, so the tiles candidates must agree
exactly with each other)."""

import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.v41_index_case import v41_index_case, v41_index_shapes

# (kernel, config); None = the production launch (first: the reference; last: the run's noise)
TILES_CANDIDATES = [
    None,
    ("tiles", dict(BLOCK_S=64, BLOCK_T=128, num_warps=8, num_stages=3)),  # one program per SM
    ("tiles", dict(BLOCK_S=64, BLOCK_T=64, num_warps=4, num_stages=3)),  # three per SM, twice the q traffic
    ("tiles", dict(BLOCK_S=64, BLOCK_T=256, num_warps=8, num_stages=2)),  # half the q traffic
    ("tiles", dict(BLOCK_S=64, BLOCK_T=128, num_warps=4, num_stages=2)),
    ("rows", None),  # the decode kernel: keys decoded once per query
    None,
]
ROWS_CANDIDATES = [
    None,
    ("rows", dict(BLOCK_T=32, num_warps=4, num_stages=1)),  # more programs (decode: more SMs busy)
    ("rows", dict(BLOCK_T=128, num_warps=4, num_stages=1)),  # one wave at 64k columns
    ("rows", dict(BLOCK_T=128, num_warps=8, num_stages=1)),
    ("rows", dict(BLOCK_T=64, num_warps=2, num_stages=1)),
    ("rows", dict(BLOCK_T=64, num_warps=4, num_stages=1)),  # ROWS_CONFIG (production below 4096 programs)
    ("rows_predecoded", None),  # candidate mode: keys decoded once, bf16 gathers (production for prefill)
    ("rows_predecoded", dict(BLOCK_T=64, num_warps=4, num_stages=1)),
    ("rows_predecoded", dict(BLOCK_T=128, num_warps=4, num_stages=1)),
    None,
]
SHAPES = {
    "full prefill n2048 start129024 r2": TILES_CANDIDATES,
    "full prefill n8192 start0 r2": TILES_CANDIDATES,
    "full decode B1 ctx131072 r2 staged1M": ROWS_CANDIDATES,
    "cand decode B1 ctx131072 NC16384": ROWS_CANDIDATES,
    "cand prefill n128 start130944 NC16384": ROWS_CANDIDATES,
}


def _label(candidate) -> str:
    if candidate is None:
        return "production"
    kernel, cfg = candidate
    if cfg is None:
        return f"{kernel} (its production config)"
    short = dict(BLOCK_S="s", BLOCK_T="t", num_warps="w", num_stages="st")
    return f"{kernel} " + " ".join(f"{short.get(k, k)}={v}" for k, v in cfg.items())


def sweep(only: str = "") -> None:
    shapes = v41_index_shapes()
    for name, candidates in SHAPES.items():
        if only not in name and only != "v41":
            continue
        case = v41_index_case(*shapes[name][1], device="cuda")
        runs = [(lambda: case.run()) if c is None else (lambda c=c: case.run(kernel=c[0], config=c[1]))
                for c in candidates]
        ref = runs[0]()
        for i, (candidate, run) in enumerate(zip(candidates, runs)):
            try:
                out = run()
                same = float((out == ref).float().mean())
                us = do_bench_cudagraph(run, rep=30, return_mode="median") * 1e3
                print(f"{name:40s} #{i:<2d} {us:10.2f} µs  bit-equal {same:.5f}  {_label(candidate)}", flush=True)
            except Exception as e:  # a config that does not compile is reported, not fatal
                print(f"{name:40s} #{i:<2d}     failed  {type(e).__name__}: {str(e)[:80]}  {_label(candidate)}",
                      flush=True)
        del case
        torch.cuda.empty_cache()
