"""Tile-config sweep of the V4.1 indexer kernels (`python -m v4serve.bench.kernel_configs v41`, or a
'|'-separated list of shape-name pieces, e.g. 'staged1M|NC16384' for the decode and candidate rows):
each candidate at a few of the PR's shapes, timed like bench/kernels.py (CUDA-graph median) and
compared with the production launch's output (the fraction of bit-equal scores; every candidate
sums the heads in its own order only in the rows kernel, so the tiles candidates must agree
exactly with each other)."""

import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.v41_index_case import CAND_BLOCK, v41_index_case, v41_index_shapes
from v4serve.ops.v41_index_stream_triton import STREAM_CONFIG, STREAM_CONFIG_CAND_PREFILL
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
# Decode and candidate mode: the streaming kernel (production) against its variants. Session 11's sweep
# (docs/performance.md) measured and retired session 10's rows kernel, 64-slot tiles, one tile a program,
# 1 / 4 programs per SM and 8 warps at these shapes (none faster than production). Left here: session 12's
# production (no early trigger of the next launch, the select-then-store epilogue), each of those two
# session-13 changes alone, the whole chain after griddepcontrol.wait (EARLY_CHAIN off: session 11's
# order), and 4 programs per SM held to 128 registers (maxnreg: 4 resident instead of 3, a few spilled
# words). Every variant writes production's bits.
STREAM = "stream"
_STREAM = STREAM_CONFIG  # 128-slot tiles, 2 programs per SM, 4 warps
_SESSION12 = dict(TRIGGER=False, SPLIT_STORE=False, SKIP_BY_LIST=False)
STREAM_CANDIDATES = [
    None,
    (STREAM, dict(_STREAM, **_SESSION12)),
    (STREAM, dict(_STREAM, TRIGGER=False)),  # the split store alone
    (STREAM, dict(_STREAM, SPLIT_STORE=False)),  # the trigger alone
    (STREAM, dict(_STREAM, EARLY_CHAIN=False)),
    (STREAM, dict(_STREAM, PROGRAMS_PER_SM=4, maxnreg=128)),
    None,
]
# Candidate prefill (production: 8 programs per SM): session 12's production, without the trigger, empty
# tiles found by their slots (session 12's test), 16 per SM, and 8 per SM with 4 or 5 resident (session 11
# retired the keys-decoded-once routes, 90-126 µs against 78-122, and 2 per SM, 79.0 / 122.3 against
# 75.8 / 119.1).
_PREFILL = STREAM_CONFIG_CAND_PREFILL
CAND_PREFILL_CANDIDATES = [
    None,
    (STREAM, dict(_PREFILL, **_SESSION12)),
    (STREAM, dict(_PREFILL, TRIGGER=False)),
    (STREAM, dict(_PREFILL, SKIP_BY_LIST=False)),  # empty tiles found by their slots (3 barriers a tile more)
    (STREAM, dict(_PREFILL, PROGRAMS_PER_SM=16)),
    (STREAM, dict(_PREFILL, maxnreg=128)),  # 4 resident
    (STREAM, dict(_PREFILL, maxnreg=96)),  # 5 resident (spills)
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
    short = dict(BLOCK_S="s", BLOCK_T="t", num_warps="w", num_stages="st", PROGRAMS_PER_SM="per_sm", TILES="tiles",
                 EARLY_CHAIN="early_chain", SPLIT_STORE="split_store", TRIGGER="trigger",
                 SKIP_BY_LIST="skip_by_list")
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
