"""Sweep of the indexer's top-k (ops/index_topk_triton.py) against torch.sort at the decode and verify
shapes (`python -m v4serve.bench.kernel_configs 'index topk'`).

Rows: B query rows (decode c1 = 1; verify c1 k3 = 4; c8 decode 8, c8 k1 verify 16, c8 k3 32) over
T static cache columns (max_model_len / 4: `bench engine`'s default 4096 -> 1024, 8K -> 2048, 32K ->
8192, 128K -> 32768), k = 512 (V4-Flash) or 1024 (V4-Pro). The scores are what the decode step sorts: a visible prefix of random
scores with ties (a tenth exact zeros, as relu(q.k) = 0 for every head gives) and -inf past it
(the last 3% of columns). Candidates: "torch.sort" (production while TOPK_KERNEL_ON_CUDA is off:
`sorted_top`'s stable sort, then the [:, :k] slices), the kernel at its split rule (`topk_splits`),
forced split counts, other loop steps / warps, and the sort-everything variant (T <= 4096). Each line: median µs (do_bench_cudagraph) and
whether the columns equal torch.sort's (they must: "exact").

Live rows ("index topk live B1 T2112 k512 n540"): a short context in a wide cache (max_model_len
8448 at ratio 4 is T 2112; a 2K-token prompt sees ~540 rows): the scores are -inf past n columns,
and the kernel runs with and without `n_live` (the decode step's visible counts), production
schedule both.
"""

import torch
from triton.testing import do_bench_cudagraph

from v4serve.ops.index_topk_reference import index_topk_reference
from v4serve.ops.index_topk_triton import SORT_ALL_COLUMNS, index_topk_triton, topk_splits

SHAPES = {f"index topk B{B} T{T} k{k}": (B, T, k) for k, pairs in (
    (512, ((1, 1024), (4, 1024), (32, 1024), (1, 2048), (4, 2048), (8, 2048), (32, 2048), (1, 8192), (4, 8192), (32, 8192), (1, 32768), (4, 32768),
           (32, 32768))),
    (1024, ((1, 2048), (4, 2048), (1, 32768), (4, 32768))),
) for B, T in pairs}

LIVE_SHAPES = {f"index topk live B{B} T{T} k512 n{n}": (B, T, n) for B, T, n in (
    (1, 2112, 540), (8, 2112, 540), (4, 2112, 2000), (1, 8192, 540), (1, 32768, 540), (8, 32768, 540),
    (1, 32768, 8000))}

CANDIDATES = [
    None,  # the kernel at its production schedule (topk_splits, BLOCK 2048, 8 warps)
    "torch.sort",
    dict(splits=1),
    dict(splits=2),
    dict(splits=4),
    dict(splits=8),
    dict(splits=16),
    dict(block=1024, num_warps=4),
    dict(block=4096, num_warps=8),  # T = 2112 (max_model_len 8448) in one loop step instead of 2048 + 64
    dict(block=4096, num_warps=16),
    dict(block=2048, num_warps=16),
    dict(sort_all=True),  # T <= 4096 only: every key of the row sorted, no select
    dict(sort_all=True, num_warps=16),
    None,
]


def topk_case(B: int, T: int, device, seed: int = 0) -> torch.Tensor:
    """fp32 [B, T] decode-step scores: random with exact-zero ties, -inf past 97% of the columns."""
    g = torch.Generator(device=device).manual_seed(seed)
    s = torch.randn(B, T, generator=g, device=device)
    s = torch.where(torch.rand(B, T, generator=g, device=device) < 0.1, 0.0, s)
    visible = max(1, T - T // 32)
    return s.masked_fill(torch.arange(T, device=device) >= visible, float("-inf"))


def topk_runner(scores: torch.Tensor, k: int):
    """run(cfg) -> the [B, k] columns of one candidate."""
    def run(cfg):
        if cfg == "torch.sort":
            return index_topk_reference(scores, k)[1]
        return index_topk_triton(scores, k, **(cfg or {}))[1]
    return run


def _label(cfg) -> str:
    if cfg is None:
        return "production (topk_splits)"
    return cfg if isinstance(cfg, str) else " ".join(f"{key}={v}" for key, v in cfg.items())


def live_case(B: int, T: int, n: int, device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [B, T] with -inf from column n on, n_live [B] int32 = n)."""
    scores = topk_case(B, T, device, seed)
    scores[:, n:] = float("-inf")
    return scores, torch.full((B,), n, dtype=torch.int32, device=device)


def live_sweep(only: str = "") -> None:
    for name, (B, T, n) in LIVE_SHAPES.items():
        if only not in name:
            continue
        scores, n_live = live_case(B, T, n, "cuda")
        want = index_topk_reference(scores, 512)[1]
        for label, cfg in (("full rows", {}), ("n_live", dict(n_live=n_live)), ("full rows", {})):
            def run():
                return index_topk_triton(scores, 512, **cfg)[1]
            exact = "exact" if torch.equal(run(), want) else "MISMATCH"
            us = do_bench_cudagraph(run, rep=30, return_mode="median") * 1e3
            print(f"{name:36s} {us:9.2f} µs  {exact:8s}  {label}", flush=True)


def sweep(only: str = "") -> None:
    live_sweep(only)
    for name, (B, T, k) in SHAPES.items():
        if only not in name:
            continue
        scores = topk_case(B, T, "cuda")
        run = topk_runner(scores, k)
        want = run("torch.sort")
        print(f"{name}: production splits {topk_splits(B, T, k)}", flush=True)
        for i, cfg in enumerate(CANDIDATES):
            if isinstance(cfg, dict) and cfg.get("sort_all") and T > SORT_ALL_COLUMNS:
                continue
            try:
                exact = "exact" if torch.equal(run(cfg), want) else "MISMATCH"
                us = do_bench_cudagraph(lambda: run(cfg), rep=30, return_mode="median") * 1e3
                print(f"{name:28s} #{i:<2d} {us:9.2f} µs  {exact:8s}  {_label(cfg)}", flush=True)
            except Exception as e:  # a config that does not compile is reported, not fatal
                print(f"{name:28s} #{i:<2d}    failed  {type(e).__name__}: {str(e)[:80]}  {_label(cfg)}", flush=True)
