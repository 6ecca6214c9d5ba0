"""Per-kernel GPU durations (torch.profiler / CUPTI) of sparse decode configs, next to the
do_bench_cudagraph time of the whole op (development tool: python scripts/kernel_durations.py)."""
import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench_cudagraph

from v4serve.bench.kernel_configs import DECODE_CANDIDATES, _label
from v4serve.bench.shapes import sparse_decode_case
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton


def durations(fn, n=50):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    per = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per[e.name[:40]].append(e.device_time)
    return {k: sorted(v)[len(v) // 2] for k, v in per.items() if len(v) >= n}


def main():
    picks = [int(i) for i in sys.argv[1].split(",")] if len(sys.argv) > 1 else range(len(DECODE_CANDIDATES))
    for r in (4, 128, 0):
        for B in (1, 8):
            case = sparse_decode_case(r, B, 32767, "cuda")
            for i in picks:
                cfg = DECODE_CANDIDATES[i]
                fn = lambda: sparse_attn_paged_triton(*case.args(), tile_config=cfg)  # noqa: E731
                us = do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3
                d = durations(fn)
                parts = "  ".join(f"{k}={v:.2f}" for k, v in d.items())
                print(f"r{r} B{B} #{i} {us:6.2f} µs | {parts} | {_label(cfg)[:60]}", flush=True)


if __name__ == "__main__":
    main()
