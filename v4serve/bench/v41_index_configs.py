"""Tile-config sweep of the V4.1 indexer kernels (`python -m v4serve.bench.kernel_configs v41`, or a
'|'-separated list of shape-name pieces, e.g. 'staged1M|NC16384' for the decode and candidate rows):
each candidate at a few of the PR's shapes, timed like bench/kernels.py (CUDA-graph median) and
compared with the production launch's output (the fraction of bit-equal scores; every candidate
sums the heads in its own order only in the rows kernel, so the tiles candidates must agree
exactly with each other)."""

import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.v41_index_case import CAND_BLOCK, v41_index_case, v41_index_shapes
from v4serve.ops.v41_index_triton import v41_index_scores_triton

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
# Decode and candidate mode: the streaming kernel (production) against session 10's rows kernel and
# its own tile sizes, warps and tiles per program (PROGRAMS_PER_SM sets how many programs share the
# tiles: more programs = fewer tiles each; TILES=1 = one tile a program, every program at once).
STREAM = "stream"
STREAM_CANDIDATES = [
    None,
    ("rows", None),  # session 10's production (ROWS_CONFIG; 128 columns past 4096 programs)
    (STREAM, dict(BLOCK_T=64, PROGRAMS_PER_SM=2, num_warps=4, num_stages=1)),  # twice the tiles, ~40% more issue
    (STREAM, dict(BLOCK_T=64, TILES=1, num_warps=4, num_stages=1)),
    (STREAM, dict(BLOCK_T=128, PROGRAMS_PER_SM=1, num_warps=4, num_stages=1)),
    (STREAM, dict(BLOCK_T=128, PROGRAMS_PER_SM=4, num_warps=4, num_stages=1)),
    (STREAM, dict(BLOCK_T=128, TILES=1, num_warps=4, num_stages=1)),
    (STREAM, dict(BLOCK_T=128, PROGRAMS_PER_SM=2, num_warps=8, num_stages=1)),  # two warpgroups a tile
    None,
]
# Candidate prefill: also the keys decoded once per step (bf16 gathers), with both kernels.
CAND_PREFILL_CANDIDATES = STREAM_CANDIDATES[:-1] + [
    ("rows_predecoded", None),  # session 10's production for candidate prefill
    ("stream_predecoded", None),
    ("stream_predecoded", dict(BLOCK_T=64, PROGRAMS_PER_SM=2, num_warps=4, num_stages=1)),
    (STREAM, dict(BLOCK_T=128, PROGRAMS_PER_SM=8, num_warps=4, num_stages=1)),
    None,
]
SHAPES = {
    "full prefill n2048 start129024 r2": TILES_CANDIDATES,
    "full prefill n8192 start0 r2": TILES_CANDIDATES,
    **{name: STREAM_CANDIDATES for name in (
        "full decode B1 ctx32768 r2 staged1M", "full decode B4 ctx32768 r2 staged1M",
        "full decode B1 ctx131072 r2 staged1M", "full decode B1 ctx131072 r1 staged1M",
        "cand decode B1 ctx131072 NC16384", "cand decode B4 ctx131072 NC16384")},
    "cand prefill n128 start8064 NC16384": CAND_PREFILL_CANDIDATES,
    "cand prefill n128 start130944 NC16384": CAND_PREFILL_CANDIDATES,
}


def _label(candidate) -> str:
    if candidate is None:
        return "production"
    kernel, cfg = candidate
    if cfg is None:
        return f"{kernel} (its production config)"
    short = dict(BLOCK_S="s", BLOCK_T="t", num_warps="w", num_stages="st", PROGRAMS_PER_SM="per_sm", TILES="tiles")
    return f"{kernel} " + " ".join(f"{short.get(k, k)}={v}" for k, v in cfg.items())


def _launch(case, kernel, config):
    """One variant's launch on the case's inputs (the dispatch's arguments, plus a tile config)."""
    return v41_index_scores_triton(case.q, case.w, case.pool, case.key_rows, case.n_visible, True, case.cand_blocks,
                                   CAND_BLOCK, kernel, config)


def sweep(only: str = "") -> None:
    """Every shape whose name holds one of the '|'-separated filters ("v41": all of them)."""
    shapes = v41_index_shapes()
    for name, candidates in SHAPES.items():
        if only != "v41" and not any(f in name for f in only.split("|")):
            continue
        case = v41_index_case(*shapes[name][1], device="cuda")
        runs = [(lambda: case.run()) if c is None else (lambda c=c: _launch(case, *c)) for c in candidates]
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
        case = runs = ref = out = None  # free the case's pool before the next shape's
        torch.cuda.empty_cache()
