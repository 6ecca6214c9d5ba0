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
"""

import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import FP8_PROJECTIONS, fp8_linear_case
from v4serve.ops.fp8_linear_decode_triton import ahead_steps
from v4serve.ops.fp8_linear_triton import decode_programs_wanted, fp8_linear_triton

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


def _median_us(fn) -> float:
    return do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def sweep(only: str, device: str = "cuda", timer=_median_us) -> None:
    for name, (n, k, m) in {**SHAPES, **W8A16_SHAPES}.items():
        if only not in name:
            continue
        weight_only = name in W8A16_SHAPES
        act_block = None if weight_only else 128
        x, weight, scale = fp8_linear_case(n, k, m, device=device)
        arrivals = torch.zeros(n, dtype=torch.int32, device=device)  # SUM_LAST's counters, kept like a module's

        default_splits, default_steps = ahead_steps(k, 128, -(-n // 64), decode_programs_wanted(x.device), None)
        if default_steps > 4:
            kinds = {"all", "long"}
        else:
            kinds = {"all", "short"} | ({"2 steps"} if default_steps <= 2 else set())

        def run(cfg, split):
            split_k = {"steps 4": -(-k // 128 // 4), "steps 8": -(-k // 128 // 8),
                       "half": max(1, default_splits // 2)}.get(split)
            # production W8A16 gets the counters FP8Linear keeps; a named config only where it sums last
            counters = cfg.get("SUM_LAST", False) if cfg is not None else weight_only
            return fp8_linear_triton(x, weight, scale, (128, 128), act_block, config=cfg, split_k=split_k,
                                     arrivals=arrivals if counters else None)

        ref = run(None, None).float()
        for i, (label, cfg, split, where) in enumerate(W8A16_CANDIDATES if weight_only else CANDIDATES):
            if where not in kinds:
                continue
            try:
                out = run(cfg, split).float()
                err = float((out - ref).norm() / ref.norm())
                us = timer(lambda: run(cfg, split))
                print(f"{name:36s} #{i:<2d} {us:8.2f} µs  err {err:.1e}  {label}", flush=True)
            except Exception as e:  # a variant that does not compile is reported, not fatal
                print(f"{name:36s} #{i:<2d}   failed  {type(e).__name__}: {str(e)[:80]}  {label}", flush=True)
