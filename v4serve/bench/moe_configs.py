"""MXFP4 MoE layer variants side by side (development tool; `python -m v4serve.bench.kernel_configs moe`).

Times the whole routed layer (route, sort, gate_up with the SwiGLU fused, down, combine: the
`mxfp4 moe flash ...` bench rows) with other tiles or weight decoders for its two grouped matmuls,
checks each against the production variant's output (relative error: only the fp32 sum order may
differ) and prints the fraction of the row's H200 floor it reaches (bytes of the experts touched at
4.3 TB/s, or the bf16 MMA time).
"""

import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.kernels import H200_TBPS, build
from v4serve.bench.shapes import MOE_TOP_K, mxfp4_moe_case
from v4serve.ops.moe_combine import moe_combine
from v4serve.ops.moe_route import moe_route
from v4serve.ops.moe_sort import moe_sort
from v4serve.ops.mxfp4_gemv_triton import GEMV_CONFIG as GEMV
from v4serve.ops.mxfp4_gemv_triton import GEMV_SWIGLU_CONFIG as GEMV_SWIGLU
from v4serve.ops.mxfp4_gemv_triton import gemv_config, mxfp4_gemv_triton
from v4serve.ops.mxfp4_grouped_matmul import mxfp4_grouped_matmul
from v4serve.ops.mxfp4_moe_decode import TENSOR_CORE_DECODE, combine_counters_size, mxfp4_experts
from v4serve.ops.mxfp4_moe_mma_gluon import mxfp4_moe_mma_gluon
from v4serve.ops.mxfp4_moe_mma_triton import MMA_CONFIG, MMA_SWIGLU_CONFIG, mxfp4_moe_mma_triton
from v4serve.ops.mxfp4_grouped_matmul_triton import (
    MXFP4_DECODE_CONFIG as DECODE,
    MXFP4_DECODE_SWIGLU_CONFIG as DECODE_SWIGLU,
    MXFP4_PREFILL_CONFIG as PREFILL,
    MXFP4_PREFILL_SWIGLU_CONFIG as PREFILL_SWIGLU,
    mxfp4_grouped_matmul_triton,
)
from v4serve.ops.swiglu import clamped_swiglu

SWIGLU_LIMIT = 10.0
# (label, gate_up tiles, down tiles, SwiGLU fused); None = production (the public op
# `mxfp4_experts`: sort-free at decode sizes, else `gemv_picks`, then `mxfp4_config`); a dict with
# PICKS = the sorted GEMV kernel (mxfp4_gemv_triton.py) with that many picks a program and those
# tiles (DECODE: "asm" / "bits"); a dict with SORT_FREE = the sort-free kernel
# (mxfp4_moe_decode_triton.py) with those tiles, AHEAD (K steps of weights in flight), EARLY
# (down weights before the PDL wait) and, on the down tiles, COMBINE (the combine in the down
# launch). The first entry is the error reference, and it comes again last (the same variant
# twice shows the noise).
SORT_FREE_UP = dict(GEMV_SWIGLU, SORT_FREE=True)
SORT_FREE_DOWN = dict(GEMV, SORT_FREE=True)
DECODE_VARIANTS = [
    ("production", None, None, True),
    ("tensor cores (session 10)", DECODE_SWIGLU, DECODE, True),
    ("gemv picks 1", dict(GEMV_SWIGLU, PICKS=1), dict(GEMV, PICKS=1), True),
    ("gemv picks 2", dict(gemv_config(2, True), PICKS=2), dict(gemv_config(2, False), PICKS=2), True),
    ("gemv picks 2, 64 rows", dict(GEMV_SWIGLU, PICKS=2), dict(GEMV, PICKS=2), True),
    ("gemv picks 4", dict(gemv_config(4, True), PICKS=4), dict(gemv_config(4, False), PICKS=4), True),
    ("gemv bits decoder", dict(GEMV_SWIGLU, PICKS=1, DECODE="bits"), dict(GEMV, PICKS=1, DECODE="bits"), True),
    ("gemv n / 2", dict(GEMV_SWIGLU, PICKS=1, BLOCK_N=16), dict(GEMV, PICKS=1, BLOCK_N=32), True),
    ("gemv k128", dict(GEMV_SWIGLU, PICKS=1, BLOCK_K=128), dict(GEMV, PICKS=1, BLOCK_K=128), True),
    ("gemv k512", dict(GEMV_SWIGLU, PICKS=1, BLOCK_K=512), dict(GEMV, PICKS=1, BLOCK_K=512), True),
    ("gemv 8 warps", dict(GEMV_SWIGLU, PICKS=1, num_warps=8), dict(GEMV, PICKS=1, num_warps=8), True),
    ("tensor cores, unfused swiglu", DECODE, DECODE, False),
    # session 14 (issue 18): the sort-free path ("gemv picks 1" above is session 13's production)
    ("sort-free, combine in down", SORT_FREE_UP, dict(SORT_FREE_DOWN, COMBINE=True), True),
    ("sort-free, 2 steps ahead", dict(SORT_FREE_UP, AHEAD=2), dict(SORT_FREE_DOWN, AHEAD=2), True),
    ("sort-free, down early + combine in down", SORT_FREE_UP, dict(SORT_FREE_DOWN, EARLY=True, COMBINE=True), True),
    ("sort-free, 2 ahead, down early + combine", dict(SORT_FREE_UP, AHEAD=2),
     dict(SORT_FREE_DOWN, AHEAD=2, EARLY=True, COMBINE=True), True),
    ("sort-free n / 2", dict(SORT_FREE_UP, BLOCK_N=16), dict(SORT_FREE_DOWN, BLOCK_N=32), True),
    ("sort-free n x 2", dict(SORT_FREE_UP, BLOCK_N=64), dict(SORT_FREE_DOWN, BLOCK_N=128), True),
    # session 14 (issue 18, branch moe-mma): the sort-free layer on tensor cores, the decoded weights
    # wgmma's register operand (ops/mxfp4_moe_mma_triton.py; err ~1e-3: the fp32 sum order)
    ("sort-free mma (weights in wgmma registers)", dict(MMA_SWIGLU_CONFIG, MMA=True), dict(MMA_CONFIG, MMA=True), True),
    ("sort-free mma, stages 2 (cp.async weights)", dict(MMA_SWIGLU_CONFIG, MMA=True, num_stages=2),
     dict(MMA_CONFIG, MMA=True, num_stages=2), True),
    ("sort-free mma, Gluon (bytes in the A fragment's layout)", dict(MMA=True, GLUON=True, STAGES=0),
     dict(MMA=True, GLUON=True, STAGES=0), True),
    # session 18 (issue 18): the Gluon kernel's bytes and scales through a ring of cp.async
    # shared-memory stages (STAGES - 1 steps in flight while a step decodes; same bits; production
    # up to 48 picks since session 18)
    *((f"sort-free mma, Gluon, cp.async {n} stages", dict(MMA=True, GLUON=True, STAGES=n),
       dict(MMA=True, GLUON=True, STAGES=n), True) for n in (3, 4, 6)),
    ("production", None, None, True),
]
PREFILL_VARIANTS = [
    ("production", None, None, True),
    ("prefill bits", dict(PREFILL_SWIGLU, DECODE="bits"), dict(PREFILL, DECODE="bits"), True),
    ("unfused swiglu", PREFILL, PREFILL, False),
    ("m128 8 warps", dict(PREFILL_SWIGLU, BLOCK_M=128), dict(PREFILL, BLOCK_M=128, num_warps=8), True),
    ("n128 8 warps", dict(PREFILL_SWIGLU, BLOCK_N=128), dict(PREFILL, BLOCK_N=128, num_warps=8), True),
    ("stages 4", dict(PREFILL_SWIGLU, num_stages=4), dict(PREFILL, num_stages=4), True),
    ("weights as A", dict(PREFILL_SWIGLU, W_AS_A=True), dict(PREFILL, W_AS_A=True), True),
    ("up n64 8 warps", dict(PREFILL_SWIGLU, BLOCK_N=64, num_warps=8), PREFILL, True),
    ("up stages 3", dict(PREFILL_SWIGLU, num_stages=3), PREFILL, True),
    ("production", None, None, True),
]
# Speculative verify batches at c8 (k = 1: 16 tokens, k = 3: 32): production (`gemv_picks`) against
# the tensor-core kernel it replaced there and the multi-pick GEMV.
VERIFY_VARIANTS = [DECODE_VARIANTS[i] for i in (0, 1, 2, 3)] + [
    v for v in DECODE_VARIANTS if v[0] in ("sort-free, combine in down", "sort-free, 2 steps ahead",
                                           "sort-free mma (weights in wgmma registers)",
                                           "sort-free mma, Gluon (bytes in the A fragment's layout)")] + [DECODE_VARIANTS[0]]
# The cp.async stages against the register loop alone ("moe staged c1", ...; production on both ends).
STAGED_VARIANTS = [DECODE_VARIANTS[0]] + [v for v in DECODE_VARIANTS if v[0].startswith("sort-free mma, Gluon")] + [
    DECODE_VARIANTS[0]]
# Session 20 (issue 18): up to 8 picks of one expert a Gluon program (GROUPED; here the pick-groups
# table is made for each projection, production makes one a layer) against a program a pick,
# production's stage rule in both ("moe grouped c8", ...; production on both ends).
GROUPED_VARIANTS = [DECODE_VARIANTS[-1]] + [
    (f"sort-free mma, Gluon, {label}", dict(MMA=True, GLUON=True, GROUPED=grouped),
     dict(MMA=True, GLUON=True, GROUPED=grouped), True)
    for label, grouped in (("a program a pick", False), ("up to 8 picks of an expert a program", True))] + [
    # Session 21: production's groups and dependent launch on the cp.async ring at 4 / 5 stages (the
    # register loop ran past 48 picks until 4 stages won there: verify c32 622.7 against 661-662 µs)
    (f"sort-free mma, Gluon, production's groups, dependent, ring {n} stages",
     dict(MMA=True, GLUON=True, GROUPED=None, PDL=True, STAGES=n), dict(MMA=True, GLUON=True, GROUPED=None, PDL=True,
                                                                         STAGES=n), True) for n in (4, 5)] + [
    DECODE_VARIANTS[-1]]
# Session 20 (issue 18): down launched as a programmatic dependent of gate_up (its first weight
# stages requested while gate_up's last programs run) against two plain launches; production's stage
# and group rules in both ("moe pdl c1", ...; production on both ends).
# Session 21: with the dependent launch, 5 and 6 ring stages instead of 4 (session 18 measured 3 / 4 / 6
# with plain launches; 5 fits 4 programs an SM: 53 KB). Both lost at c1 / c8 / verify c4 (5 stages:
# 41.4 / 221.0 / 120.9 µs against 37.0-38.4 / 204.3-210.5 / 111.5-112.5).
PDL_VARIANTS = [DECODE_VARIANTS[-1]] + [
    (f"sort-free mma, Gluon, production's rules, {label}",
     dict(MMA=True, GLUON=True, GROUPED=None, PDL=pdl, STAGES=stages),
     dict(MMA=True, GLUON=True, GROUPED=None, PDL=pdl, STAGES=stages), True)
    for label, pdl, stages in (("plain launches", False, None), ("down a dependent launch of gate_up", True, None),
                               ("dependent, 5 stages", True, 5), ("dependent, 6 stages", True, 6),
                               ("route -> gate_up -> down -> combine dependent", "chain", None))] + [
    DECODE_VARIANTS[-1]]
SHAPES = {"moe flash c1": ("flash", 1), "moe flash c8": ("flash", 8), "moe flash c64": ("flash", 64),
          "moe flash prefill S2048": ("flash", 2048),
          "moe flash verify c16": ("flash", 16), "moe flash verify c32": ("flash", 32),
          "moe staged c1": ("flash", 1), "moe staged c8": ("flash", 8), "moe staged verify c32": ("flash", 32),
          "moe grouped c8": ("flash", 8), "moe grouped verify c16": ("flash", 16),
          "moe grouped verify c32": ("flash", 32), "moe grouped c64": ("flash", 64),
          "moe pdl c1": ("flash", 1), "moe pdl c8": ("flash", 8), "moe pdl verify c4": ("flash", 4),
          "moe pdl verify c32": ("flash", 32)}


def _matmul(x, w, s, rows, ends, picks, cfg, swiglu_limit=None):
    """One grouped matmul by the variant's kernel: None = production (the public op)."""
    if cfg is None:
        return mxfp4_grouped_matmul(x, w, s, rows, ends, swiglu_limit=swiglu_limit)
    if "PICKS" in cfg:
        return mxfp4_gemv_triton(x, w, s, rows, ends, picks, cfg["PICKS"], cfg, swiglu_limit, cfg.get("DECODE"))
    return mxfp4_grouped_matmul_triton(x, w, s, rows, ends, picks, cfg, swiglu_limit)


def layer(case, up_cfg, down_cfg, fused):
    """The routed layer with the given kernels / tiles for the gate_up and down matmuls."""
    x, logits, w13, s13, w2, s2 = case
    bias = torch.zeros(logits.shape[1], device=x.device)
    if up_cfg is not None and "MMA" in up_cfg:  # route, the two tensor-core projections, combine
        def mma():
            experts, weights = moe_route(logits, MOE_TOP_K, "sqrtsoftplus", True, 1.5, bias=bias)
            flat = experts.reshape(-1).contiguous()
            if up_cfg.get("GLUON"):  # STAGES / GROUPED None: production's rule (GROUPED unsaid: a program a
                rule = dict(stages=up_cfg.get("STAGES"), grouped=up_cfg.get("GROUPED", False))  # pick); PDL
                # PDL True: gate_up triggers, down requests its first weights, then waits; "chain" (production
                # since session 21): gate_up also a dependent of the route (waiting first), down triggering
                # the combine when its grid is one wave
                pdl = up_cfg.get("PDL", False)
                chain = pdl == "chain"
                hidden = mxfp4_moe_mma_gluon(x, w13, s13, flat, MOE_TOP_K, True, SWIGLU_LIMIT, pdl_trigger=bool(pdl),
                                             pdl_wait_first=chain, **rule)
                y = mxfp4_moe_mma_gluon(hidden, w2, s2, flat, MOE_TOP_K, False, pdl_wait=bool(pdl),
                                        pdl_trigger=None if chain else False, **rule)
            else:
                hidden = mxfp4_moe_mma_triton(x, w13, s13, flat, MOE_TOP_K, True, up_cfg, SWIGLU_LIMIT)
                y = mxfp4_moe_mma_triton(hidden, w2, s2, flat, MOE_TOP_K, False, down_cfg)
            return moe_combine(y, None, weights.float().contiguous())

        return mma
    if up_cfg is None or "SORT_FREE" in up_cfg:  # the public op (production), or its sort-free kernel's tiles
        arrivals = torch.zeros(combine_counters_size(w13.shape[0], MOE_TOP_K, w2.shape[1]), dtype=torch.int32,
                               device=x.device)  # kept across calls, as MXFP4Experts keeps them
        tiles = (dict(tensor_cores=TENSOR_CORE_DECODE) if up_cfg is None  # production's route (the case is exact)
                 else dict(configs=(up_cfg, down_cfg), combine_in_down=down_cfg.get("COMBINE", False)))

        def public():
            experts, weights = moe_route(logits, MOE_TOP_K, "sqrtsoftplus", True, 1.5, bias=bias)
            return mxfp4_experts(x, experts, weights, (w13, s13, w2, s2), SWIGLU_LIMIT, arrivals=arrivals, **tiles)

        return public

    def run():
        experts, weights = moe_route(logits, MOE_TOP_K, "sqrtsoftplus", True, 1.5, bias=bias)
        rows, ends, pos = moe_sort(experts, w13.shape[0])
        picks = rows.shape[0]
        if fused:
            hidden = _matmul(x, w13, s13, rows, ends, picks, up_cfg, SWIGLU_LIMIT)
        else:
            gate, up = _matmul(x, w13, s13, rows, ends, picks, up_cfg).chunk(2, dim=-1)
            hidden = clamped_swiglu(gate, up, SWIGLU_LIMIT)
        y = _matmul(hidden, w2, s2, None, ends, picks, down_cfg)
        return moe_combine(y, pos, weights)

    return run


def sweep(only: str) -> None:
    for name, (model, tokens) in SHAPES.items():
        if only not in name:
            continue
        _, nbytes, flops, _, peak = build("mxfp4_moe", (model, tokens), "cuda")
        floor_us = max(nbytes / (H200_TBPS * 1e6), flops / (peak * 1e6))
        case = mxfp4_moe_case(model, tokens, "cuda")
        variants = (STAGED_VARIANTS if "staged" in name else GROUPED_VARIANTS if "grouped" in name
                    else PDL_VARIANTS if "pdl" in name
                    else PREFILL_VARIANTS if tokens >= 2048
                    else VERIFY_VARIANTS if "verify" in name else DECODE_VARIANTS)
        ref = layer(case, *variants[0][1:])().float()
        for i, (label, up_cfg, down_cfg, fused) in enumerate(variants):
            try:
                fn = layer(case, up_cfg, down_cfg, fused)
                err = float((fn().float() - ref).norm() / ref.norm())
                us = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
                print(f"{name:24s} #{i:<2d} {us:9.2f} µs  floor {floor_us / us:5.3f}  err {err:.1e}  {label}", flush=True)
            except Exception as e:  # a variant that does not compile is reported, not fatal
                print(f"{name:24s} #{i:<2d}    failed  {type(e).__name__}: {str(e)[:80]}  {label}", flush=True)
        del case
        torch.cuda.empty_cache()
