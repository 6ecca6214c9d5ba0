"""The mHC mixer with its coefficients epilogue, variants side by side (`python -m
v4serve.bench.kernel_configs 'mhc coeffs'`): V4-Flash (4 streams of 4096, fn [24, 16384] fp32), T
tokens, one CUDA graph a variant, median µs, error relative to the first candidate's comb.

  production   tile_config(T, K): 128 programs over K, the epilogue in sub-blocks of COEFF_T =
               next_pow2(T) tokens (2 to 16)
  coeff_t 16   the epilogue over the whole 16-token block (production before this branch: 8
               tokens a warp, 4 matrix entries a thread, a serial chain 4x as long)
  coeff_t 2    2-token sub-blocks at T = 8 (4 serial Sinkhorns; same bits: the Sinkhorn sums are fixed
               pairwise trees)
  programs P   K split for P programs instead of 128 (fewer: fewer partials for the last program to
               sum, longer K loops; more: the reverse); the mixes' fp32 sums change order (~1e-7)
"""

import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import mhc_case
from v4serve.ops.hc_mix_triton import tile_config, hc_mix_triton

# (label, COEFF_T or None = production's, programs): "production" first (the reference) and last (noise).
CANDIDATES = [
    ("production", None, 128),
    ("coeff_t 16", 16, 128),
    ("coeff_t 2", 2, 128),
    ("programs 64", None, 64),
    ("programs 256", None, 256),
    ("production", None, 128),
]
SHAPES = {f"mhc coeffs T{T}": T for T in (1, 8)}


def _median_us(fn) -> float:
    return do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3


def sweep(only: str, device: str = "cuda", timer=_median_us) -> None:
    for name, T in SHAPES.items():
        if only not in name:
            continue
        streams, fn, base, scale = mhc_case(T, device=device)
        x, n = streams.flatten(1), streams.shape[1]
        tickets = torch.zeros(64, dtype=torch.int32, device=device)
        coefficients = dict(base=base, scale=scale, n=n, iters=20, hc_eps=1e-6)

        def run(coeff_t, programs):
            cfg = tile_config(T, x.shape[1], programs)
            if coeff_t is not None:
                cfg["COEFF_T"] = coeff_t
            return hc_mix_triton(x, fn, 1e-6, tickets, config=cfg, coefficients=coefficients)[4]

        ref = run(None, 128)
        for i, (label, coeff_t, programs) in enumerate(CANDIDATES):
            if coeff_t is not None and coeff_t == tile_config(T, x.shape[1])["COEFF_T"]:
                continue  # production's own sub-block
            try:
                out = run(coeff_t, programs)
                err = float((out - ref).norm() / ref.norm())
                us = timer(lambda: run(coeff_t, programs))
                print(f"{name:16s} #{i:<2d} {us:8.2f} µs  err {err:.1e}  {label}", flush=True)
            except Exception as e:  # a variant that does not compile is reported, not fatal
                print(f"{name:16s} #{i:<2d}   failed  {type(e).__name__}: {str(e)[:80]}  {label}", flush=True)
