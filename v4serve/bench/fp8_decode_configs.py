"""Decode variants of the FP8 linear side by side (`python -m v4serve.bench.kernel_configs 'fp8 decode'`):
at the Flash projections, M 1 and 8, the official numerics (activations e4m3 per 128), one CUDA graph
a variant (the linear's every launch), median µs, error relative to the first candidate's output.

  production  fp8_linear_triton's own choice (the weights-first kernel where `decode_ahead_plan` takes it)
  tiles       the tile kernels: act_quant, split-K matmul, in-order sum (three launches; production
              before session 12)
  ahead ...   the weights-first kernel (ops/fp8_linear_decode_triton.py) with FP8_AHEAD_CONFIG's keys
              changed: QUANT_A False (act_quant launched first with an early trigger, so the weights
              stream during it), SUM_LAST (the last program of a tile sums the partials: one launch;
              its counters kept across calls as a module would keep them), MAX_STEPS / split (wq_b and
              wo_b: 8 and 13 steps a program at the default split), 8 warps.
"""

import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import FP8_PROJECTIONS, fp8_linear_case
from v4serve.ops.fp8_linear_triton import fp8_linear_triton

# (label, config, split_k); "production" first (the error reference) and last (the run's noise)
CANDIDATES = [
    ("production", None, None),
    ("tiles", dict(KERNEL="tiles"), None),
    ("ahead", dict(KERNEL="ahead"), None),
    ("ahead codes", dict(KERNEL="ahead", QUANT_A=False), None),
    ("ahead sum_last", dict(KERNEL="ahead", SUM_LAST=True), None),
    ("ahead codes sum_last", dict(KERNEL="ahead", QUANT_A=False, SUM_LAST=True), None),
    ("ahead 8 warps", dict(KERNEL="ahead", num_warps=8), None),
    ("ahead steps<=8", dict(KERNEL="ahead", MAX_STEPS=8), None),
    ("ahead split x2", dict(KERNEL="ahead", MAX_STEPS=8), "x2"),
    ("production", None, None),
]
SHAPES = {f"fp8 decode flash {proj} M{m}": (n, k, m) for proj, (n, k) in FP8_PROJECTIONS["flash"].items()
          for m in (1, 8) if m == 1 or proj in ("wq_a", "wkv", "shared_w1")}


def _split(weight, x, split):
    """`split` relative to the default: "x2" doubles the weights-first kernel's default split."""
    if split is None:
        return None
    from v4serve.ops.fp8_linear_decode_triton import FP8_AHEAD_CONFIG, ahead_steps
    from v4serve.ops.fp8_linear_triton import _programs_wanted

    tiles = -(-weight.shape[0] // FP8_AHEAD_CONFIG["BLOCK_N"])
    splits, _ = ahead_steps(weight.shape[1], FP8_AHEAD_CONFIG["BLOCK_K"], tiles, _programs_wanted(x.device), None)
    return 2 * splits


def sweep(only: str) -> None:
    for name, (n, k, m) in SHAPES.items():
        if only not in name:
            continue
        x, weight, scale = fp8_linear_case(n, k, m, device="cuda")
        arrivals = torch.zeros(n, dtype=torch.int32, device="cuda")  # SUM_LAST's counters, kept like a module's

        def run(cfg, split):
            return fp8_linear_triton(x, weight, scale, (128, 128), 128, config=cfg, split_k=_split(weight, x, split),
                                     arrivals=arrivals)

        ref = run(None, None).float()
        for i, (label, cfg, split) in enumerate(CANDIDATES):
            try:
                out = run(cfg, split).float()
                err = float((out - ref).norm() / ref.norm())
                us = do_bench_cudagraph(lambda: run(cfg, split), rep=20, return_mode="median") * 1e3
                print(f"{name:30s} #{i:<2d} {us:8.2f} µs  err {err:.1e}  {label}", flush=True)
            except Exception as e:  # a variant that does not compile is reported, not fatal
                print(f"{name:30s} #{i:<2d}   failed  {type(e).__name__}: {str(e)[:80]}  {label}", flush=True)
