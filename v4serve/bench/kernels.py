"""`v4serve bench kernels`: time every op at the PR's shapes on the GPU.

Each shape is timed with triton.testing.do_bench_cudagraph (median), in two interleaved passes
over the shape list; the better median is reported. Inputs are L2-hot there (the graph replays
one input set). The L2-cold figure replays one graph that runs the op over enough rotating input
sets to overflow the 60 MB L2, divided by the number of sets. Per shape the table gives µs, the
bytes and FLOPs the op must move (each input row read once, the output written once), the
achieved TB/s and TFLOP/s, the fraction of the H200 floor (4.3 TB/s copy, 790 TFLOP/s bf16
MMA, measured), the PR's H100 time and our target, and the sha256 of the output. One JSON line
follows the table.
"""

import argparse
import hashlib
import json
import sys
import time

import torch
import triton
from triton.testing import do_bench_cudagraph

from v4serve.bench.shapes import (
    HEAD_DIM,
    HEADS,
    MOE_TOP_K,
    PR_NEW38_US,
    TARGET_US,
    all_shapes,
    expert_fetch_case,
    gated_pool_case,
    indexer_case,
    fp8_linear_case,
    mhc_case,
    mxfp4_moe_case,
    quant_case,
    sparse_decode_case,
    sparse_prefill_case,
)
from v4serve.bench.v41_index_case import build_v41_index
from v4serve.ops.expert_fetch import expert_fetch
from v4serve.ops.gated_pool import gated_pool
from v4serve.ops.hc_coefficients import hc_coefficients
from v4serve.ops.hc_mix import hc_mix
from v4serve.ops.indexer import index_scores
from v4serve.ops.fp8_linear import fp8_linear
from v4serve.ops.kv_quant import apply_kv_format
from v4serve.ops.moe_route import moe_route
from v4serve.ops.mxfp4_moe_decode import TENSOR_CORE_DECODE, combine_counters_size, mxfp4_experts
from v4serve.ops.sparse_attn import sparse_attn_paged
from v4serve.ops.sparse_attn_reference import live_columns

H200_TBPS, H200_TFLOPS = 4.3, 790.0
H200_FP8_TFLOPS = 1257.0
HOST_LINK_GBPS = 55.0  # pinned host -> device, measured with copy-engine transfers on the H200 host (issue 18)
L2_BYTES = 60 << 20
MAX_COLD_SETS = 256  # the tiniest shapes rotate through 256 sets, which still fit in L2


def _sparse_work(case):
    live = live_columns(case.idx, 128, case.counts)
    pairs = int(live.sum())
    rows = int(torch.unique(torch.cat([case.idx[..., :128][live[..., :128]],
                                       case.idx[..., 128:][live[..., 128:]] + case.win_pool.shape[0]])).numel())
    io = 2 * case.q.numel() * case.q.element_size() + case.idx.numel() * 4
    return io + rows * HEAD_DIM * 2, 4 * HEADS * HEAD_DIM * pairs


# ---- quantized weights: FP8 linear, MXFP4 MoE layer ----
def _build_fp8_linear(n, k, m, act_block, *, device, seed):
    """Floor: the weight bytes (+ scales, x in, y out) at HBM speed, or the MMA time (fp8 when the
    activations are quantized, bf16 for weight-only), whichever is longer. With the split counters
    a model's FP8Linear keeps (`arrivals`: the last program of a tile may sum the split partials)."""
    x, weight, scale = fp8_linear_case(n, k, m, device=device, seed=seed)
    arrivals = torch.zeros(n, dtype=torch.int32, device=device)
    nbytes = weight.numel() + scale.numel() * 4 + x.numel() * 2 + m * n * 2
    peak = H200_FP8_TFLOPS if act_block else H200_TFLOPS
    return ((lambda: fp8_linear(x, weight, scale, (128, 128), act_block=act_block, arrivals=arrivals)), nbytes,
            2 * m * n * k, nbytes, peak)


def _build_mxfp4_moe(model, tokens, device, seed):
    """The routed MoE layer as `MXFP4Experts` runs it: route (sqrtsoftplus top-6), then `mxfp4_experts`
    (decode sizes: MXFP4 gate_up with the clamped SwiGLU fused and MXFP4 down, a program per pick,
    no sort; larger: sort, the grouped matmuls), combine. Floor: the packed bytes and scales of the
    experts the routing touches (+ x, logits, out), or the bf16 MMA time."""
    x, logits, w13, s13, w2, s2 = mxfp4_moe_case(model, tokens, device=device, seed=seed)
    bias = torch.zeros(logits.shape[1], device=device)
    arrivals = torch.zeros(combine_counters_size(w13.shape[0], MOE_TOP_K, w2.shape[1]), dtype=torch.int32,
                           device=device)

    def layer():  # production's decode route (the case's scale bytes are all <= 128: exact on tensor cores)
        experts, weights = moe_route(logits, MOE_TOP_K, "sqrtsoftplus", True, 1.5, bias=bias)
        return mxfp4_experts(x, experts, weights, (w13, s13, w2, s2), 10.0, arrivals=arrivals,
                             tensor_cores=TENSOR_CORE_DECODE)

    touched = int(torch.unique(moe_route(logits, MOE_TOP_K, "sqrtsoftplus", True, 1.5, bias=bias)[0]).numel())
    per_expert = sum(t[0].numel() for t in (w13, s13, w2, s2))
    nbytes = touched * per_expert + x.numel() * 2 * 2 + logits.numel() * 2
    flops = 2 * tokens * MOE_TOP_K * (w13.shape[1] * x.shape[1] + w2.shape[1] * 2 * w2.shape[2])
    return layer, nbytes, flops, nbytes, H200_TFLOPS


# ---- packed KV rows (issue 17): the "... fp8kv" rows run the same cases over packed pools ----
KV_ROW_FORMAT, INDEX_ROW_FORMAT = "fp8_e8m0_b64_rope64", "fp4_e8m0_b32"


def _build_fp8kv(kind, args, device, seed):
    """The case of `kind` with its pools packed (rows quantized once, outside the timing)."""
    from v4serve.formats import row_format
    from v4serve.ops.kv_pack import pack_rows

    if kind == "indexer":
        q, w, k_pool, key_rows, n_visible = indexer_case(*args, device=device, seed=seed)
        B, S, H, Dk = q.shape
        T = key_rows.shape[1]
        packed = pack_rows(k_pool, INDEX_ROW_FORMAT)
        live = int(n_visible.clamp(max=T).sum())
        keys = int(n_visible.clamp(max=T).amax(1).sum())
        nbytes = q.numel() * 2 + w.numel() * 4 + keys * packed.shape[1] + key_rows.numel() * 4 + B * S * T * 4
        fn = lambda: index_scores(q, w, packed, key_rows, n_visible, row_format=INDEX_ROW_FORMAT)  # noqa: E731
        return fn, nbytes, 2 * H * Dk * live, nbytes
    case = (sparse_prefill_case if kind == "prefill" else sparse_decode_case)(*args, device=device, seed=seed)
    nbytes, flops = _sparse_work(case)
    row_bytes = row_format(KV_ROW_FORMAT).row_bytes(HEAD_DIM)
    q, win, cmp, idx, n_window, sink, scale, counts = case.args()
    rows_read = (nbytes - 2 * case.q.numel() * case.q.element_size() - case.idx.numel() * 4) // (HEAD_DIM * 2)
    nbytes += rows_read * (row_bytes - HEAD_DIM * 2)
    pw, pc = pack_rows(win, KV_ROW_FORMAT), pack_rows(cmp, KV_ROW_FORMAT)
    fn = lambda: sparse_attn_paged(q, pw, pc, idx, n_window, sink, scale, counts, row_format=KV_ROW_FORMAT)  # noqa: E731
    return fn, nbytes, flops, nbytes


def _build_kv_compact(args, device, seed):
    """The compaction of a prefill case's packed pools (kv_compact.py). Floor: the column table read
    twice and written once, each used row's packed bytes read and its bf16 values written."""
    from v4serve.formats import row_format
    from v4serve.ops.kv_compact import unpack_referenced_rows
    from v4serve.ops.kv_pack import pack_rows

    case = sparse_prefill_case(*args, device=device, seed=seed)
    fmt = row_format(KV_ROW_FORMAT)
    q, win, cmp, idx, n_window, sink, scale, counts = case.args()
    pw, pc = pack_rows(win, fmt), pack_rows(cmp, fmt)
    cols, ct = idx.reshape(-1, idx.shape[-1]), counts.reshape(-1)
    live = live_columns(case.idx, n_window, case.counts).reshape(cols.shape)
    g = torch.where(torch.arange(cols.shape[1], device=device) < n_window, cols.long(), cols.long() + win.shape[0])
    used = int(torch.unique(g[live]).numel())
    nbytes = 3 * cols.numel() * 4 + used * (pw.shape[1] + HEAD_DIM * 2)
    # the output hashed is the renumbered table (the pool rows past the used ones are never written)
    return (lambda: unpack_referenced_rows(pw, pc, cols, n_window, fmt, HEAD_DIM, counts=ct)[1]), nbytes, 0, nbytes


def _build_expert_fetch(kind, model, n, device, seed):
    """Offloaded experts into device slots: the zero-copy kernel (its SMs read pinned host memory,
    graph-capturable with a device-side copy list) or, for reference, copy-engine transfers of the
    same rows (cudaMemcpyAsync; their addresses are fixed at capture). Floor: the host link."""
    hosts, devices, count, slots, rows = expert_fetch_case(model, n, device, seed)
    nbytes = sum(h.numel() for h in hosts)
    order = [(int(s), int(r)) for s, r in zip(slots[:n].tolist(), rows[:n].tolist())]

    def fn():
        for host, dev in zip(hosts, devices):
            if kind == "expert_fetch":
                expert_fetch(host, dev, count, slots, rows, 4)
            else:
                for slot, row in order:
                    dev[4 + slot].copy_(host[row], non_blocking=True)
        return devices[0]

    return fn, nbytes, 0, nbytes, None


def build(kind, args, device, seed=0):
    """-> (fn, bytes, flops, bytes of one input set[, MMA peak TFLOP/s of the floor; None: the
    bytes cross the host link, not HBM])."""
    if kind in ("expert_fetch", "expert_copy_engine"):
        return _build_expert_fetch(kind, *args, device=device, seed=seed)
    if kind.endswith("_fp8kv"):
        return _build_fp8kv(kind.removesuffix("_fp8kv"), args, device, seed)
    if kind == "kv_compact":
        return _build_kv_compact(args, device, seed)
    if kind == "o_a":
        from v4serve.bench.o_a_case import build_o_a

        return build_o_a(*args, device=device, seed=seed)
    if kind.startswith("glue_"):
        from v4serve.bench.launch_glue_case import build_launch_glue

        return build_launch_glue(kind, args, device, seed)
    if kind.startswith("fused_"):
        from v4serve.bench.decode_fusion_case import build_decode_fusion

        return build_decode_fusion(kind, args, device, seed, mhc_case=mhc_case)
    if kind == "fp8_linear":
        return _build_fp8_linear(*args, device=device, seed=seed)
    if kind == "mxfp4_moe":
        return _build_mxfp4_moe(*args, device=device, seed=seed)
    if kind == "v41_index":
        return build_v41_index(*args, device=device, seed=seed)
    if kind in ("decode_v41kv", "prefill_v41kv", "engram_lookup"):
        from v4serve.bench.v41_attn_case import build_engram_lookup, build_v41_attn

        if kind == "engram_lookup":
            return build_engram_lookup(*args, device=device, seed=seed)
        return build_v41_attn(kind, args, device, seed)
    if kind == "indexer":
        q, w, k_pool, key_rows, n_visible = indexer_case(*args, device=device, seed=seed)
        B, S, H, Dk = q.shape
        T = key_rows.shape[1]
        live = int(n_visible.clamp(max=T).sum())  # (query, key) pairs scored
        keys = int(n_visible.clamp(max=T).amax(1).sum())  # key rows read
        nbytes = q.numel() * 2 + w.numel() * 4 + keys * Dk * 2 + key_rows.numel() * 4 + B * S * T * 4
        return (lambda: index_scores(q, w, k_pool, key_rows, n_visible)), nbytes, 2 * H * Dk * live, nbytes
    if kind == "quant":
        fmt, rows, D = args
        x = quant_case(rows, D, device=device, seed=seed)
        return (lambda: apply_kv_format(x, fmt)), 2 * x.numel() * 2, 0, 2 * x.numel() * 2
    if kind == "mhc":
        op, T = args
        streams, fn, base, scale = mhc_case(T, device=device, seed=seed)
        x = streams.flatten(1)
        tickets = torch.zeros(1024, dtype=torch.int32, device=device)  # the cache's zeroed counters
        if op == "mix":  # mixes = fn @ x and the RMS factor: fn and x read, [T, 25] written
            nbytes = x.numel() * 2 + fn.numel() * 4 + T * (fn.shape[0] + 1) * 4
            return (lambda: hc_mix(x, fn, 1e-6, tickets)[0]), nbytes, 2 * T * fn.numel(), nbytes
        mixes, row_scale = hc_mix(x, fn, 1e-6, tickets)
        n = streams.shape[1]  # coefficients: [T, 24] and [T] read, pre, post [T, n] and comb [T, n, n] written
        nbytes = T * (fn.shape[0] + 1 + 2 * n + n * n) * 4
        return (lambda: hc_coefficients(mixes, row_scale, base, scale, n, 20, 1e-6)[2]), nbytes, 0, nbytes
    if kind == "gated_pool":
        kv, score = gated_pool_case(*args, device=device, seed=seed)
        B, R, D = args
        return (lambda: gated_pool(kv, score)), 2 * kv.numel() * 4 + B * D * 4, 3 * B * R * D, 2 * kv.numel() * 4
    case = (sparse_prefill_case if kind == "prefill" else sparse_decode_case)(*args, device=device, seed=seed)
    nbytes, flops = _sparse_work(case)
    return (lambda: sparse_attn_paged(*case.args())), nbytes, flops, nbytes


def time_hot(fn):
    return do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3


def time_cold(kind, args, device, set_bytes):
    n_sets = max(2, min(MAX_COLD_SETS, -(-3 * L2_BYTES // set_bytes)))
    fns = [build(kind, args, device, seed=s)[0] for s in range(n_sets)]
    return do_bench_cudagraph(lambda: [f() for f in fns], rep=100, return_mode="median") * 1e3 / n_sets


def sha256(out: torch.Tensor | tuple | list) -> str:
    """The first 16 hex digits of the sha256 of an output's bytes (a tuple's tensors in order)."""
    digest = hashlib.sha256()
    for t in out if isinstance(out, (tuple, list)) else (out,):
        raw = t.detach().contiguous().cpu()
        digest.update((raw if raw.dtype == torch.uint8 else raw.view(torch.uint8)).numpy().tobytes())
    return digest.hexdigest()[:16]


def run(names, cold: bool, device="cuda", log=sys.stderr):
    """Yield one row per shape, in order, as soon as it is measured (a time limit keeps the rows
    already printed)."""
    shapes = all_shapes()
    built = {}
    for n in names:
        t0 = time.perf_counter()
        built[n] = build(*shapes[n], device)
        print(f"# built {n} ({time.perf_counter() - t0:.1f} s)", file=log, flush=True)
    best = {n: float("inf") for n in names}
    for _ in range(2):
        for n in names:
            best[n] = min(best[n], time_hot(built[n][0]))
    for n in names:
        fn, nbytes, flops, set_bytes = built[n][:4]
        peak = built[n][4] if len(built[n]) > 4 else H200_TFLOPS
        us = best[n]
        if peak is None:  # host-link bytes
            floor_us = nbytes / (HOST_LINK_GBPS * 1e3)
        else:
            floor_us = max(nbytes / (H200_TBPS * 1e6), flops / (peak * 1e6))
        kind = shapes[n][0]
        yield dict(
            shape=n, us=round(us, 2),
            cold_us=round(time_cold(kind, shapes[n][1], device, set_bytes), 2) if cold and not kind.startswith(("prefill", "expert", "engram")) else None,
            bytes=nbytes, flops=flops, tbps=round(nbytes / us / 1e6, 3), tflops=round(flops / us / 1e6, 1),
            floor_frac=round(floor_us / us, 3), pr_h100_us=PR_NEW38_US.get(n),
            speedup_vs_pr=round(PR_NEW38_US[n] / us, 2) if n in PR_NEW38_US else None,
            target_us=TARGET_US.get(n), sha256=sha256(fn()),
        )
        del built[n]
        torch.cuda.empty_cache()


def verdict(row) -> str:
    pr, us, target = row["pr_h100_us"], row["us"], row["target_us"]
    ok = (pr is None or (us <= pr and (pr <= 5 or us <= pr / 2))) and (target is None or us <= target)
    return "ok" if ok else "MISS"


TABLE_HEAD = (f"{'shape':34s} {'µs':>9s} {'cold µs':>8s} {'TB/s':>6s} {'TF/s':>6s} {'floor':>6s} {'PR H100':>8s} "
              f"{'x PR':>6s} {'target':>7s}  {'':4s} sha256")


def table_line(r) -> str:
    cold = f"{r['cold_us']:8.2f}" if r["cold_us"] is not None else f"{'-':>8s}"
    target = f"{r['target_us']:7.1f}" if r["target_us"] else f"{'-':>7s}"
    pr = f"{r['pr_h100_us']:8.2f} {r['speedup_vs_pr']:6.2f}" if r["pr_h100_us"] else f"{'-':>8s} {'-':>6s}"
    return (f"{r['shape']:34s} {r['us']:9.2f} {cold} {r['tbps']:6.2f} {r['tflops']:6.1f} {r['floor_frac']:6.3f} "
            f"{pr} {target}  {verdict(r):4s} {r['sha256']}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="v4serve bench kernels", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--only", default="", help="substring filter on shape names, e.g. 'decode'; "
                        "'a|b' keeps the names holding a or b")
    parser.add_argument("--no-cold", action="store_true", help="skip the L2-cold figures")
    parser.add_argument("--json", default=None, help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("v4serve bench kernels needs a CUDA GPU", file=sys.stderr)
        return 2
    names = [n for n in all_shapes() if any(f in n for f in args.only.split("|"))]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print(TABLE_HEAD, flush=True)
    rows = []
    for row in run(names, cold=not args.no_cold):
        rows.append(row)
        print(table_line(row), flush=True)
        line = json.dumps(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                               triton=triton.__version__, rows=rows))
        if args.json:  # rewritten after every row: a run stopped at its time limit keeps its rows
            with open(args.json, "w") as f:
                f.write(line + "\n")
    print(line)
    return 0

if __name__ == "__main__":
    sys.exit(main())
