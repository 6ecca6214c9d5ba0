"""Decode variants of the FP8 linear side by side (`python -m v4serve.bench.kernel_configs 'fp8 decode'`):
at the Flash projections, M 1 and 8, the official numerics (activations e4m3 per 128), one CUDA graph
a variant (the linear's every launch), median µs, error relative to the first candidate's output.

  production  fp8_linear_triton's own choice (the weights-first kernel where `decode_ahead_plan` takes it)
  tiles       the tile kernels: act_quant, split-K matmul, in-order sum (three launches; production
              before session 12)
  ahead ...   the weights-first kernel (ops/fp8_linear_decode_triton.py) with FP8_AHEAD_CONFIG's
              keys changed: codes (QUANT_A False: act_quant launched first with an early trigger,
              so the weights stream during it), sum_last (the last program of a tile sums the
              partials: one launch; its counters kept across calls as a module would keep them,
              `fp8_linear(..., arrivals=)`), half split, sum block 128, steps 4 (below).

W8A16 rows (`'fp8 decode w8a16'`: the weight-only numerics the models run by default, M1 at the six
Flash projections, the indexer's q_b and q_a + kv fused, M8 at wq_a), production with the counters
FP8Linear keeps:
  production  `w8a16_decode_choice` (W8A16_DECODE_RULE by steps a program; fp8_linear_triton.py)
  tiles       the tile kernel + the sum kernel (two launches: production before session 13)
  tiles sum_last / ahead sum_last / ahead in_order sum_last (the tiles' step order) / ahead half
  split sum_last: as above, weight-only.
The row to keep per steps class goes into W8A16_DECODE_RULE (its configs are these rows' configs).

Rows at 16 and 32 (`'fp8 decode rows'`: W8A16 at the verify batches, c4 k = 3 / c8 k = 1 and c8
k = 3, and plain decode at c16 / c32; the Flash and Pro projections), production with the counters:
  production  16 rows: W8A16_DECODE_RULE; 32: W8A16_DECODE_ALWAYS_M (decode tiles at 32) and
              W8A16_ROWS32_RULE
  prefill     the 128 x 128 prefill tiles (production at 32 rows before session 14 where they fill
              the GPU: Flash / Pro wq_b)
  tiles       the decode tiles, 16 / 32 rows in one tile, the sum kernel (production at 32 rows
              elsewhere before session 14)
  tiles sum_last (where the shape has several splits), tiles n128 (128 weight rows a program: half
  the x re-reads from L2; with 64 weight rows and 32 x rows a program reads as many x bytes as
  weight bytes), tiles n128 8 warps, tiles n256 8 warps (3 stages: a quarter of the x reads), tiles
  3 stages: the tile variants, all with the 1-16-row path's K split (`decode_split_k`), so every
  row but "prefill" has the bits of the plain step's rows (err 0 against production).
The 32-row winner per steps class goes into W8A16_ROWS32_RULE (its config is the rule's value).

The shared expert's gate | up with its SwiGLU (`'fp8 decode swiglu'`: W8A16, Flash [2 x 2048, 4096]
and Pro [2 x 3072, 7168], M 1 / 8 / 16 / 32 / 64), each row the whole of w1 + w3 + SwiGLU in one graph:
  production  `fp8_linear_swiglu` with the counters: one launch, the SwiGLU in the last program of
              each gate / up tile pair (session 14)
  unfused     w1 and w3 (production's kernels, their counters) + the SwiGLU kernel: three launches
              (production before session 14)
  no counters `fp8_linear_swiglu` without counters: the stacked linear (the members' kernel and
              split, the sum kernel where it splits) + the SwiGLU kernel
All three give the same bits (err 0).
"""

import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import FP8_PROJECTIONS, fp8_linear_case
from v4serve.ops.fp8_linear_decode_triton import ahead_steps
from v4serve.ops.fp8_linear import fp8_linear_swiglu
from v4serve.ops.fp8_linear_triton import decode_programs_wanted, decode_split_k, fp8_linear_triton
from v4serve.ops.swiglu import clamped_swiglu

# (label, config, split, where): "production" first (the error reference) and last (the run's noise).
# split "half": half the default splits (about one program a SM, twice the steps each, half the
# partials to sum); "steps 4" / "steps 8": the K range split into 4- or 8-step programs (wq_b 2 or 1
# splits, wo_b 16 or 8; 8 steps: 200 registers at 4 warps, 2 programs a SM, sm_90 Triton 3.6).
# where: "all"; "short" (the projections production runs on the weights-first kernel, at most 4
# steps a program); "2 steps" (at most 2 at the default split: wq_a, wkv); "long" (wq_b, wo_b:
# 8 and 16 steps a program at the default split, so the tile kernels in production).
CANDIDATES = [
    ("production", None, None, "all"),
    ("tiles", dict(KERNEL="tiles"), None, "short"),
    ("ahead codes", dict(KERNEL="ahead", QUANT_A=False), None, "short"),
    ("ahead sum_last", dict(KERNEL="ahead", SUM_LAST=True), None, "short"),
    ("ahead half split", dict(KERNEL="ahead"), "half", "2 steps"),
    ("ahead sum block 128", dict(KERNEL="ahead", SUM_BLOCK=128), None, "2 steps"),
    ("ahead steps 4", dict(KERNEL="ahead"), "steps 4", "long"),
    ("ahead steps 4 sum_last", dict(KERNEL="ahead", SUM_LAST=True), "steps 4", "long"),
    ("ahead steps 8", dict(KERNEL="ahead", MAX_STEPS=8), "steps 8", "long"),
    ("production", None, None, "all"),
]
SHAPES = {f"fp8 decode flash {proj} M{m}": (n, k, m) for proj, (n, k) in FP8_PROJECTIONS["flash"].items()
          for m in (1, 8) if m == 1 or proj == "wq_a"}
W8A16_CANDIDATES = [  # (the weights-first kernel only up to 4 steps: at 8-16 it lost in act mode, session 13's sweep)
    ("production", None, None, "all"),
    ("tiles", dict(KERNEL="tiles"), None, "all"),
    ("tiles sum_last", dict(KERNEL="tiles", SUM_LAST=True), None, "all"),
    ("ahead sum_last", dict(KERNEL="ahead", MAX_STEPS=4, SUM_LAST=True), None, "short"),
    ("ahead in_order sum_last", dict(KERNEL="ahead", MAX_STEPS=4, SUM_LAST=True, IN_ORDER=True), None, "short"),
    ("ahead half split sum_last", dict(KERNEL="ahead", MAX_STEPS=8, SUM_LAST=True), "half", "2 steps"),
    ("production", None, None, "all"),
]
W8A16_SHAPES = {f"fp8 decode w8a16 flash {proj} M{m}": (n, k, m)
                for proj, (n, k) in {**FP8_PROJECTIONS["flash"], "indexer_q_b": (8192, 1024),
                                     "wq_a+wkv": (1536, 4096)}.items()  # (q_a + kv fused: model/fusion.py)
                for m in (1, 8) if m == 1 or proj == "wq_a"}

# where: "all", or "split" (shapes whose decode tiles split K: something to sum)
ROWS_CANDIDATES = [
    ("production", None, None, "all"),
    ("prefill", dict(KERNEL="prefill"), None, "all"),
    ("tiles", dict(KERNEL="tiles"), None, "all"),
    ("tiles sum_last", dict(KERNEL="tiles", SUM_LAST=True), None, "split"),
    ("tiles n128", dict(KERNEL="tiles", BLOCK_N=128, SUM_LAST=True), None, "all"),
    ("tiles n128 8 warps", dict(KERNEL="tiles", BLOCK_N=128, num_warps=8, SUM_LAST=True), None, "all"),
    ("tiles n256 8 warps", dict(KERNEL="tiles", BLOCK_N=256, num_warps=8, num_stages=3, SUM_LAST=True), None, "all"),
    ("tiles 3 stages", dict(KERNEL="tiles", num_stages=3, SUM_LAST=True), None, "all"),
    ("production", None, None, "all"),
]
ROWS_SHAPES = {f"fp8 decode rows w8a16 {model} {proj} M{m}": (n, k, m)
               for model, table in FP8_PROJECTIONS.items() for proj, (n, k) in table.items() for m in (16, 32)}
SWIGLU_SHAPES = {f"fp8 decode swiglu {model} shared_w1+w3 M{m}": (*table["shared_w1"], m)
                 for model, table in FP8_PROJECTIONS.items() for m in (1, 8, 16, 32, 64)}
SWIGLU_LIMIT = 10.0  # V4's swiglu_limit


def _median_us(fn) -> float:
    return do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def sweep(only: str, device: str = "cuda", timer=_median_us) -> None:
    for name, (n, k, m) in {**SHAPES, **W8A16_SHAPES, **ROWS_SHAPES}.items():
        if only not in name:
            continue
        weight_only = name in W8A16_SHAPES or name in ROWS_SHAPES
        act_block = None if weight_only else 128
        x, weight, scale = fp8_linear_case(n, k, m, device=device)
        arrivals = torch.zeros(n, dtype=torch.int32, device=device)  # SUM_LAST's counters, kept like a module's

        default_splits, default_steps = ahead_steps(k, 128, -(-n // 64), decode_programs_wanted(x.device), None)
        if default_steps > 4:
            kinds = {"all", "long"}
        else:
            kinds = {"all", "short"} | ({"2 steps"} if default_steps <= 2 else set())
        candidates = W8A16_CANDIDATES if weight_only else CANDIDATES
        if name in ROWS_SHAPES:
            candidates = ROWS_CANDIDATES
            kinds = {"all"} | ({"split"} if decode_split_k(n, -(-k // 128), x.device) > 1 else set())

        def run(cfg, split):
            split_k = {"steps 4": -(-k // 128 // 4), "steps 8": -(-k // 128 // 8),
                       "half": max(1, default_splits // 2)}.get(split)
            # production W8A16 gets the counters FP8Linear keeps; a named config only where it sums last
            counters = cfg.get("SUM_LAST", False) if cfg is not None else weight_only
            return fp8_linear_triton(x, weight, scale, (128, 128), act_block, config=cfg, split_k=split_k,
                                     arrivals=arrivals if counters else None)

        ref = run(None, None).float()
        for i, (label, cfg, split, where) in enumerate(candidates):
            if where not in kinds:
                continue
            try:
                out = run(cfg, split).float()
                err = float((out - ref).norm() / ref.norm())
                us = timer(lambda: run(cfg, split))
                print(f"{name:36s} #{i:<2d} {us:8.2f} µs  err {err:.1e}  {label}", flush=True)
            except Exception as e:  # a variant that does not compile is reported, not fatal
                print(f"{name:36s} #{i:<2d}   failed  {type(e).__name__}: {str(e)[:80]}  {label}", flush=True)


def sweep_swiglu(only: str, device: str = "cuda", timer=_median_us) -> None:
    """The SwiGLU rows (module docstring): fused, unfused, fused without counters."""
    for name, (i, k, m) in SWIGLU_SHAPES.items():
        if only not in name:
            continue
        x, weight, scale = fp8_linear_case(2 * i, k, m, device=device)
        (w1, s1), (w3, s3) = (weight[:i], scale[:i // 128]), (weight[i:], scale[i // 128:])
        arrivals = [torch.zeros(2 * i // 64, dtype=torch.int32, device=device) for _ in range(3)]

        def unfused():
            gate = fp8_linear_triton(x, w1, s1, (128, 128), None, arrivals=arrivals[1])
            up = fp8_linear_triton(x, w3, s3, (128, 128), None, arrivals=arrivals[2])
            return clamped_swiglu(gate, up, SWIGLU_LIMIT)

        runs = [("production", lambda: fp8_linear_swiglu(x, weight, scale, SWIGLU_LIMIT, arrivals=arrivals[0])),
                ("unfused", unfused),
                ("no counters", lambda: fp8_linear_swiglu(x, weight, scale, SWIGLU_LIMIT)),
                ("production", lambda: fp8_linear_swiglu(x, weight, scale, SWIGLU_LIMIT, arrivals=arrivals[0]))]
        ref = runs[0][1]().float()
        for j, (label, fn) in enumerate(runs):
            try:
                out = fn().float()
                diff = int((out != ref).sum())
                us = timer(fn)
                print(f"{name:36s} #{j:<2d} {us:8.2f} µs  differing {diff}  {label}", flush=True)
            except Exception as e:  # reported, not fatal
                print(f"{name:36s} #{j:<2d}   failed  {type(e).__name__}: {str(e)[:80]}  {label}", flush=True)
