"""Tile sweep of the FP8 GEMV (ops/fp8_gemv_triton.py), run by `python -m v4serve.bench.kernel_configs
'fp8 gemv'`: at the Flash projections with M 1 and 8, the production tensor-core kernel ("mma"),
the GEMV at its default tiles and split, and variants of rows a program (BLOCK_N), K step,
prefetch depth, row 0's codes in the ring or not (X_AHEAD, M1), warps and the K split (a multiple of the default). Errors are relative to the "mma" output.
"""

from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import FP8_PROJECTIONS, fp8_linear_case
from v4serve.ops.fp8_gemv_triton import GEMV_CONFIG, fp8_gemv_triton, gemv_split_k
from v4serve.ops.fp8_linear import fp8_linear


def _gemv(block_n, block_k=128, warps=4, split=None, prefetch=2, x_ahead=True):
    return dict(BLOCK_N=block_n, BLOCK_K=block_k, PREFETCH=prefetch, X_AHEAD=x_ahead, num_warps=warps,
                num_stages=1), split


# "mma" first (the error reference) and last (the run's noise); (config, split) pairs: None = default
CANDIDATES = [
    "mma",
    (None, None),
    _gemv(64, x_ahead=False), _gemv(64, prefetch=1), _gemv(32), _gemv(32, prefetch=1), _gemv(128),
    # 256-byte K steps: as many bytes in flight per program with PREFETCH 1, no ring MOVs
    # (sm_90 SASS: 3.7 / 3.9 instructions a weight byte at 64 / 32 rows, against 4.5 for the default)
    _gemv(64, block_k=256, prefetch=1), _gemv(32, block_k=256, prefetch=1), _gemv(32, block_k=256),
    _gemv(64, warps=8),
    _gemv(64, split="x2"), _gemv(64, split="/2"),
    "mma",
]
SHAPES = {f"fp8 gemv flash {proj} M{m}": (n, k, m) for proj, (n, k) in FP8_PROJECTIONS["flash"].items() for m in (1, 8)}


def _label(cand) -> str:
    if isinstance(cand, str):
        return "production tensor-core kernel (mma)"
    cfg, split = cand
    if cfg is None:
        return "gemv, default tiles and split"
    return (f"gemv n={cfg['BLOCK_N']} k={cfg['BLOCK_K']} prefetch={cfg['PREFETCH']} x_ahead={cfg['X_AHEAD']} "
            f"w={cfg['num_warps']} split={split or 'default'}")


def _run(x, weight, scale, cand):
    if isinstance(cand, str):
        return fp8_linear(x, weight, scale, act_block=128, kernel="mma")
    cfg, split = cand
    split_k = None
    if isinstance(split, str):  # relative to the wrapper's choice, at this config's tile count
        tiles = -(-weight.shape[0] // (cfg or GEMV_CONFIG)["BLOCK_N"])
        steps = -(-weight.shape[1] // (cfg or GEMV_CONFIG)["BLOCK_K"])
        base = gemv_split_k(tiles, steps, x.device)
        split_k = min(steps, 2 * base) if split == "x2" else max(1, base // 2)  # (x2 of 1: 2 splits)
    return fp8_gemv_triton(x, weight, scale, (128, 128), 128, config=cfg, split_k=split_k)


def sweep(only: str) -> None:
    for name, (n, k, m) in SHAPES.items():
        if only not in name:
            continue
        x, weight, scale = fp8_linear_case(n, k, m, device="cuda")
        ref = _run(x, weight, scale, CANDIDATES[0]).float()
        for i, cand in enumerate(CANDIDATES):
            try:
                out = _run(x, weight, scale, cand).float()
                err = float((out - ref).norm() / ref.norm())
                us = do_bench_cudagraph(lambda: _run(x, weight, scale, cand), rep=30, return_mode="median") * 1e3
                print(f"{name:28s} #{i:<2d} {us:8.2f} µs  err {err:.1e}  {_label(cand)}", flush=True)
            except Exception as e:  # a config that does not compile is reported, not fatal
                print(f"{name:28s} #{i:<2d}   failed  {type(e).__name__}: {str(e)[:80]}  {_label(cand)}", flush=True)
