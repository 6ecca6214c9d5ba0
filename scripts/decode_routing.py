"""A decode step's attention as the engine could pass it: one [1, T] prefill call (M = T) or T
[1]-token rows (M = 1, the decode dispatch). Development tool: python scripts/decode_routing.py"""
import torch
from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import sparse_decode_case
from v4serve.ops.sparse_attn_triton import sparse_attn_paged_triton


def main():
    for r in (4, 128, 0):
        for T in (1, 2, 4, 8, 16, 24, 32, 48, 64):
            c = sparse_decode_case(r, T, 2303, "cuda")
            as_decode = c.args()
            q, win, cmp, idx, n_window, sink, scale, counts = as_decode
            as_prefill = (q.view(1, T, *q.shape[2:]), win, cmp, idx.view(1, T, -1), n_window, sink, scale,
                          counts.view(1, T))
            outs, times = [], []
            for args in (as_prefill, as_decode, as_prefill, as_decode):
                fn = lambda a=args: sparse_attn_paged_triton(*a)  # noqa: E731
                outs.append(fn().reshape(T, -1).float())
                times.append(do_bench_cudagraph(fn, rep=30, return_mode="median") * 1e3)
            err = float((outs[0] - outs[1]).norm() / outs[0].norm())
            print(f"r{r:<3d} T{T:<3d} C{idx.shape[-1]:<4d} prefill(M=T) {times[0]:7.2f} / {times[2]:7.2f} µs"
                  f"   decode(M=1) {times[1]:7.2f} / {times[3]:7.2f} µs   rel diff {err:.1e}", flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
