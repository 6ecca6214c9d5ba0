"""Engine benchmark on a GPU: TTFT of a long prompt, time per output token (TPOT) at several
concurrencies, and how busy the GPU is during one decode step.

    python -m v4serve.bench.engine --model deepseek-v4-flash --hf-overrides '{"num_hidden_layers": 8}'
    python -m v4serve.bench.engine --model deepseek-v4.1-flash --hf-overrides '{"num_hidden_layers": 12}'

At start-up it prints the KV rows of every tier and the KV bytes per token measured on the pools,
derived from the row formats and spent by the budget (`kv_bytes.py`), and whether they agree.

The full V4-Flash with expert offload, uniform then Zipf-skewed routing with the experts placed
by measured use (scripts/gpu_flash_e2e.sh runs this and the Pro runs):

    python -m v4serve.bench.engine --hf-overrides '{}' --cpu-offload-gb auto --ttft-prompt-lens 2048 8192 \
        --max-model-len 8448 --concurrency 1 8 32 --routing uniform zipf --placement static by-use --no-profile

The MXFP4 experts' decode route, A/B end to end (`--moe-decode gemv | tensor-cores`, bound when the
model is built; the header and the JSON's `moe_decode` say how many layers decode on tensor cores:
only layers with every expert on the GPU do, so A/B a depth that fits, without offload):

    python -m v4serve.bench.engine --hf-overrides '{"num_hidden_layers": 30}' --concurrency 1 8 --moe-decode tensor-cores

Also reported: load time (engine construction: weights, graphs, KV cache), the memory map (device
weights, resident experts, expert slots, host experts, KV), per routing mode the measured expert
use of the offloaded layers (`router_skew.use_summary`) and the expert fetches per decode step.

TTFT: one request alone, from `add_request` to its first token (prefill in one step). TPOT: N
requests with short prompts decode together; per request, the time between its tokens once all N
have started, as a client sees it (no GPU sync between steps, so overlapped decode runs as in
serving). GPU busy fraction: a profiler trace of decode steps; the union of kernel intervals over
the kernel timeline's span, and over the wall time of as many steps run without the profiler.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from v4serve.bench.kv_bytes import kv_bytes_lines
from v4serve.engine import Engine, EngineArgs, SamplingParams
from v4serve.engine.offload import calibrate_placement, memory_summary, parse_cpu_offload_gb, reset_use_counts
from v4serve.model.loader import offloads_of
from v4serve.model.quantized import MXFP4Experts
from v4serve.model.router_skew import apply_zipf_routing, use_summary
from v4serve.ops.mxfp4_moe_decode import TENSOR_CORE_DECODE


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _run_until_first_token(engine: Engine, rid: str, prompt: list[int], params: SamplingParams) -> float:
    _sync()
    start = time.perf_counter()
    engine.add_request(rid, prompt, params)
    while True:
        outs = engine.step()
        if any(o.request_id == rid and o.outputs[0].token_ids for o in outs):
            _sync()
            return time.perf_counter() - start


def _drain(engine: Engine) -> None:
    while engine.has_unfinished():
        engine.step()


def measure_ttft(engine: Engine, prompt_len: int, repeats: int, seed: int = 0) -> list[float]:
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    gen = torch.Generator().manual_seed(seed)
    times = []
    for i in range(repeats + 1):  # the first run compiles kernels
        prompt = torch.randint(10, 1000, (prompt_len,), generator=gen).tolist()
        t = _run_until_first_token(engine, f"ttft{seed}-{prompt_len}-{i}", prompt, params)
        _drain(engine)
        if i:
            times.append(t)
    return times


def measure_prefix_ttft(engine: Engine, prefix_len: int, prompt_len: int, repeats: int) -> dict:
    """TTFT of a `prompt_len`-token turn after a `prefix_len`-token shared prefix (a system prompt),
    cold and warm. Per repeat, a fresh random prefix P and two turns U0, U1: cold is P + U0 (P never
    seen: every token computed), warm is P + U1 right after it (with prefix caching, a hit on P's
    cached pages: only the tokens after the hit are computed). The first pair is a warm-up (kernels
    compile) and is dropped. `warm_cached_tokens`: the prompt tokens each warm turn found in the
    cache (the cache's own counter; 0 with caching off; a hit ends on the chunk grid, see
    docs/prefix-caching.md)."""
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    gen = torch.Generator().manual_seed(1)
    prefix_cache = engine.cache.prefix  # None with prefix caching off

    def random_ids(n: int) -> list[int]:
        return torch.randint(10, 1000, (n,), generator=gen).tolist()

    cold, warm, cached = [], [], []
    for i in range(repeats + 1):
        prefix = random_ids(prefix_len)
        t_cold = _run_until_first_token(engine, f"cold{i}", prefix + random_ids(prompt_len), params)
        _drain(engine)
        hits_before = prefix_cache.hits if prefix_cache is not None else 0
        t_warm = _run_until_first_token(engine, f"warm{i}", prefix + random_ids(prompt_len), params)
        _drain(engine)
        if i:
            cold.append(1e3 * t_cold)
            warm.append(1e3 * t_warm)
            cached.append((prefix_cache.hits if prefix_cache is not None else 0) - hits_before)
    return {"prefix_len": prefix_len, "prompt_len": prompt_len, "prefix_caching": prefix_cache is not None,
            "chunk_grid": engine.cache.chunk_grid if prefix_cache is not None else None,
            "ttft_cold_ms": [round(t, 2) for t in cold], "ttft_warm_ms": [round(t, 2) for t in warm],
            "warm_cached_tokens": cached, "ttft_cold_ms_median": statistics.median(cold),
            "ttft_warm_ms_median": statistics.median(warm),
            "cold_over_warm": statistics.median(cold) / statistics.median(warm)}


def measure_tpot(engine: Engine, concurrency: int, prompt_len: int, output_len: int, seed: int = 0,
                 outputs: dict[str, list[int]] | None = None) -> dict:
    """Time per output token while all `concurrency` requests decode: from the step in which the last
    of them got its first token, per request (time of its last token - that time) / (tokens since),
    the median over requests. Nothing synchronises the GPU between steps, so overlapped decode (step
    N+1 queued before step N's tokens are read) runs as it does in serving. The prompts and request
    ids depend only on the arguments; `outputs` (given) receives each request's output tokens. With
    offloaded experts, also the experts fetched per decode step over the same span (device counters,
    read at the end)."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    gen = torch.Generator().manual_seed(concurrency + 1000 * seed)
    fetched = _fetch_counter(engine)
    for i in range(concurrency):
        engine.add_request(f"s{seed}c{concurrency}-{i}", torch.randint(10, 1000, (prompt_len,), generator=gen).tolist(),
                           params)
    counts: dict[str, int] = {}
    mark: tuple[float, dict[str, int]] | None = None  # (time, tokens per request) once all have started
    last: dict[str, tuple[float, int]] = {}
    fetched_at_mark, steps_after_mark = None, 0
    while engine.has_unfinished():
        outs = engine.step()
        now = time.perf_counter()
        for out in outs:
            counts[out.request_id] = len(out.outputs[0].token_ids)
            if outputs is not None:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
            last[out.request_id] = (now, counts[out.request_id])
        if mark is None and len(counts) == concurrency:
            mark = (now, dict(counts))
            fetched_at_mark = fetched()  # a device tensor: no synchronisation
        elif mark is not None:
            steps_after_mark += 1
    per_request = sorted((t - mark[0]) / (n - mark[1][rid]) for rid, (t, n) in last.items() if n > mark[1][rid])
    if not per_request:
        raise RuntimeError(f"no request decoded after all {concurrency} had started; raise --output-len")
    # the same span: tokens decoded after the mark (a speculative step may give a request several) over
    # the time to the last of them (not the prefills before it, nor a first call's kernel compiles)
    decoded = sum(n - mark[1][rid] for rid, (_, n) in last.items())
    span = max(t for t, _ in last.values()) - mark[0]
    row = {"concurrency": concurrency, "tpot_ms": 1e3 * statistics.median(per_request),
           "tpot_max_ms": 1e3 * per_request[-1], "output_tok_s": decoded / span}
    if fetched_at_mark is not None and steps_after_mark:
        row["expert_fetches_per_step"] = round(float(fetched() - fetched_at_mark) / steps_after_mark, 2)
    return row


def _fetch_counter(engine: Engine):
    """() -> experts fetched so far by every offloaded layer (a device tensor; None without offload)."""
    offloads = offloads_of(engine.model)
    if not offloads:
        return lambda: None
    return lambda: torch.stack([o._fetches for o in offloads]).sum()


def gpu_busy_fraction(engine: Engine, concurrency: int, steps: int = 100) -> dict:
    """Kernel-time union over `steps` profiled decode steps (after warm-up). idle_fraction is taken
    over the kernel timeline's span (first kernel start to last kernel end); idle_fraction_wall over
    the host's wall time of the profiled steps, which also counts the first step's launch from an
    idle, synchronised GPU; idle_fraction_unprofiled over the wall time of as many steps run just
    before without the profiler."""
    params = SamplingParams(temperature=0.0, max_tokens=2 * steps + 8, ignore_eos=True)
    gen = torch.Generator().manual_seed(100 + concurrency)
    for i in range(concurrency):  # distinct prompts: the requests route to different experts
        engine.add_request(f"prof{i}", torch.randint(10, 1000, (64,), generator=gen).tolist(), params)
    while any(r.num_computed < r.num_tokens - 1 for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(3):
        engine.step()
    _sync()
    # The same number of steps without the profiler first: CUPTI's tracing lengthens the gaps between
    # graph-replayed kernels once a process has captured 4 or more CUDA graphs (0.49 vs 0.18 µs per
    # kernel at c=1, docs/performance.md) but not the kernels, so busy time over this wall time is
    # the idle fraction of an unobserved step.
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    _sync()
    wall_unprofiled = time.perf_counter() - t0
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:  # kernel timeline only: little host overhead
        t0 = time.perf_counter()
        for _ in range(steps):
            engine.step()
        _sync()
        wall = time.perf_counter() - t0
    kernels = sorted(
        (e.time_range.start, e.time_range.end, e.name) for e in prof.events() if e.device_type.name == "CUDA"
    )
    busy, end, gaps, last = 0.0, -1.0, [], ""
    # (kernel before, kernel after) -> its gaps, split at 20 µs: launch gaps inside a graph vs host waits
    short_gaps: dict[tuple[str, str], list[float]] = {}
    long_gaps: dict[tuple[str, str], list[float]] = {}
    for a, b, name in kernels:
        if b <= end:
            continue
        if end >= 0 and a > end:
            gaps.append(a - end)
            by_pair = long_gaps if a - end >= 20.0 else short_gaps
            by_pair.setdefault((last[:40], name[:40]), []).append(a - end)
        busy += b - max(a, end)
        end, last = b, name
    _drain(engine)
    busy_s = busy / 1e6
    span_s = (max(b for _, b, _ in kernels) - kernels[0][0]) / 1e6
    small_gaps = [g for g in gaps if g < 20.0]  # µs: launch gaps inside a graph, not host waits
    return {"concurrency": concurrency, "steps": steps, "wall_ms_per_step": 1e3 * wall / steps,
            "gpu_busy_ms_per_step": 1e3 * busy_s / steps, "span_ms_per_step": 1e3 * span_s / steps,
            "wall_ms_per_step_unprofiled": 1e3 * wall_unprofiled / steps,
            "idle_fraction": 1 - busy_s / span_s, "idle_fraction_wall": 1 - busy_s / wall,
            "idle_fraction_unprofiled": 1 - busy_s / wall_unprofiled,
            "kernels_per_step": len(kernels) / steps,
            "gap_ms_per_step_under_20us": sum(small_gaps) / 1e3 / steps,
            "gap_ms_per_step_over_20us": (sum(gaps) - sum(small_gaps)) / 1e3 / steps,
            "gaps_per_step_by_us": {f"{lo}-{hi}": sum(lo <= g < hi for g in gaps) / steps
                                    for lo, hi in ((0, 1), (1, 2), (2, 5), (5, 20), (20, float("inf")))},
            "top_kernels": _top_kernels(kernels, steps),
            "long_gaps": _largest_gaps(long_gaps, steps, 6), "short_gaps": _largest_gaps(short_gaps, steps, 10)}


def _largest_gaps(by_pair: dict[tuple[str, str], list[float]], steps: int, top: int) -> list[tuple]:
    """(kernel before, kernel after, gaps per step, µs per step) of the pairs with the most gap time."""
    rows = [(*pair, len(g) / steps, round(sum(g) / steps, 1)) for pair, g in by_pair.items()]
    return sorted(rows, key=lambda row: -row[3])[:top]


def _top_kernels(kernels: list[tuple[float, float, str]], steps: int, top: int = 25) -> list[tuple[str, float, float]]:
    """(name, launches per step, µs per step) of the kernels with the most launches."""
    count: dict[str, int] = {}
    total: dict[str, float] = {}
    for a, b, name in kernels:
        name = name[:60]
        count[name] = count.get(name, 0) + 1
        total[name] = total.get(name, 0.0) + (b - a)
    names = sorted(count, key=lambda n: -count[n])[:top]
    return [(n, count[n] / steps, round(total[n] / steps, 1)) for n in names]


def host_profile(engine: Engine, concurrency: int, steps: int = 20, top: int = 15) -> None:
    """Where the host spends a decode step: cProfile of `steps` steps, top functions by own time."""
    import cProfile
    import pstats

    params = SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True)
    gen = torch.Generator().manual_seed(200 + concurrency)
    for i in range(concurrency):
        engine.add_request(f"host{i}", torch.randint(10, 1000, (128,), generator=gen).tolist(), params)
    while any(r.num_computed < r.num_tokens - 1 for r in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    profiler.disable()
    _drain(engine)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="v4serve bench engine", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--model", default="deepseek-v4-flash", help="preset name or checkpoint folder")
    parser.add_argument("--hf-overrides", type=json.loads, default={"num_hidden_layers": 8},
                        help="JSON object of config.json overrides")
    parser.add_argument("--prompt-len", type=int, default=2048, help="prompt tokens per request (TTFT)")
    parser.add_argument("--ttft-prompt-lens", type=int, nargs="+", default=None, metavar="N",
                        help="TTFT prompt lengths, one measurement each (None: --prompt-len)")
    parser.add_argument("--ttft-repeats", type=int, default=3, help="timed TTFT runs per length (after one warm-up)")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None,
                        help="tokens per step, whose multiples (in whole pages) are prefix caching's chunk grid "
                             "(None: the longest TTFT prompt, so it prefills in one step)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                        help="prefix caching (None: the engine's default, on where supported)")
    parser.add_argument("--prefix-len", type=int, default=0,
                        help="only measure TTFT of a --prompt-len turn after a shared prefix of this many tokens, "
                             "cold vs warm (prefix-cache hit)")
    parser.add_argument("--output-len", type=int, default=256, help="tokens generated per request (TPOT)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64], help="concurrent requests, one run each")
    parser.add_argument("--max-model-len", type=int, default=4096, help="the engine's context length")
    parser.add_argument("--max-num-seqs", type=int, default=None,
                        help="the engine's sequence limit (None: the largest concurrency); it sets the KV pages "
                             "and the default graph ladder (four or more graphs lengthen every graph's launch gaps: "
                             "docs/performance.md)")
    parser.add_argument("--cuda-graph-sizes", type=int, nargs="+", default=None, metavar="N",
                        help="decode batch sizes captured as CUDA graphs (None: 1 2 4 ... max-num-seqs)")
    parser.add_argument("--num-kv-pages", type=int, default=None,
                        help="KV pages (None: solved from free GPU memory for max_num_seqs full-length sequences)")
    parser.add_argument("--kv-cache-dtype", choices=["auto", "bf16"], default=None,
                        help="KV rows: the model's native packed formats or bf16 (None: the device's default)")
    parser.add_argument("--quantization", choices=["fp8", "fp8-reference", "none"], default=None,
                        help="override the weight format (None: the preset's official FP8 / MXFP4)")
    parser.add_argument("--cpu-offload-gb", default=0, help="GiB of routed experts in host memory, or 'auto'")
    parser.add_argument("--routing", choices=["uniform", "zipf"], nargs="+", default=["uniform"],
                        help="routing modes, measured in turn on one engine: the preset's routers (uniform expected "
                             "use), or routers re-drawn so expected expert use follows Zipf(--zipf-exponent) "
                             "(model/router_skew.py); with --spec-verify, step costs in every mode")
    parser.add_argument("--zipf-exponent", type=float, default=1.0, help="exponent a of the Zipf routing (use of rank r ~ r^-a)")
    parser.add_argument("--placement", choices=["static", "by-use"], nargs="+", default=["static"],
                        help="offloaded experts, per routing mode (one value: every mode): as they are (loaded: the "
                             "highest ids of each layer), or a calibration run counts picks and the most used go to "
                             "the GPU before the mode's measurements")
    parser.add_argument("--no-offload-overlap", action="store_true",
                        help="offloaded layers: the resident experts join the first fetched chunk's pass (one MoE "
                             "pass fewer, the fetch not hidden) instead of computing beside the fetch")
    parser.add_argument("--offload-prefetch", action="store_true",
                        help="offloaded layers: each MoE layer guesses the next one's picks with the next router and "
                             "prefetches them (model/expert_prefetch.py)")
    parser.add_argument("--calibration-tokens", type=int, default=4096,
                        help="prompt tokens of the calibration run (8 requests, 32 generated tokens each)")
    parser.add_argument("--speculative-config", type=json.loads, default=None,
                        help='speculative decoding, e.g. \'{"method": "mtp", "num_speculative_tokens": 3}\' '
                             "(random weights accept almost nothing: the numbers are the verify-step cost)")
    parser.add_argument("--no-profile", action="store_true", help="skip the GPU-busy profile after the TPOT runs")
    parser.add_argument("--json-out", default=None, help="also write the result JSON to this file")
    parser.add_argument("--spec-verify", action="store_true",
                        help="only the speculative-decoding rows (bench/spec_decode.py): verify-step cost for each "
                             "--spec-k against a plain decode step at each --concurrency, and TPOT at forced "
                             "acceptance lengths --spec-lengths with k = --spec-e2e-k")
    parser.add_argument("--spec-k", type=int, nargs="+", default=[1, 2, 3, 4], help="drafts per step timed")
    parser.add_argument("--spec-lengths", type=float, nargs="+", default=[2.0, 2.8, 3.5],
                        help="mean acceptance lengths forced end to end")
    parser.add_argument("--spec-e2e-k", type=int, default=3, help="drafts per step of the end-to-end runs")
    parser.add_argument("--spec-rows32", nargs="+", default=["production"],
                        choices=["production", "sum-kernel", "sum-last"],
                        help="with --spec-verify: the step costs once per rule of the FP8 linears at 17..32 rows "
                             "(a c8 k = 3 verify step): production's, the K split summed by a second launch, or by "
                             "the last program of each tile (bench/spec_decode.py ROWS32_RULES)")
    parser.add_argument("--spec-draft-head", nargs="+", choices=["shared", "fp8"], default=["fp8"],
                        help="with --spec-verify: the step costs once per head the MTP drafts read (the lm head, "
                             "or its FP8 copy, production's on CUDA: speculative_config draft_head); the "
                             "end-to-end rows use the last")
    parser.add_argument("--spec-profile", action="store_true",
                        help="with --spec-verify: the kernels whose time grows most from a plain step to a verify step")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="GPUs (one process each, NCCL); rank 0 is measured")
    parser.add_argument("--enable-expert-parallel", action="store_true", help="routed experts split by expert")
    parser.add_argument("--moe-decode", choices=["gemv", "tensor-cores"],
                        default="tensor-cores" if TENSOR_CORE_DECODE else "gemv",
                        help="the MXFP4 experts' decode route, bound when the engine builds the model (default: "
                             "production's rule, ops/mxfp4_moe_decode.TENSOR_CORE_DECODE); tensor-cores takes the "
                             "layers whose scale bytes are all <= 128 (the header says how many)")
    parser.add_argument("--host-profile", action="store_true", help="only profile the host side of decode steps")
    parser.add_argument("--profile-only", action="store_true", help="only the GPU-busy profile of decode steps")
    return parser


def engine_args(args) -> EngineArgs:
    """The engine the bench measures, from its flags."""
    return EngineArgs(
        model=args.model, hf_overrides=args.hf_overrides, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs or max(args.concurrency),
        max_num_batched_tokens=args.max_num_batched_tokens or max(args.ttft_prompt_lens or [args.prompt_len]),
        enable_prefix_caching=args.enable_prefix_caching,
        num_kv_pages=args.num_kv_pages, kv_cache_dtype=args.kv_cache_dtype, quantization=args.quantization,
        cpu_offload_gb=parse_cpu_offload_gb(str(args.cpu_offload_gb)),
        cuda_graph_sizes=None if args.cuda_graph_sizes is None else tuple(args.cuda_graph_sizes),
        speculative_config=args.speculative_config, offload_overlap=not args.no_offload_overlap,
        offload_prefetch=args.offload_prefetch, tensor_core_decode=args.moe_decode == "tensor-cores",
        tensor_parallel_size=args.tensor_parallel_size, enable_expert_parallel=args.enable_expert_parallel,
    )


def moe_decode_summary(model, route: str) -> dict:
    """The decode route asked for, and the MXFP4 expert layers that decode on tensor cores:
    those `bind_decode` chose (a layer with host experts too: its decode passes take the route,
    model/quantized_offload.py)."""
    layers = [m for m in model.modules() if isinstance(m, MXFP4Experts)]
    return {"route": route, "mxfp4_layers": len(layers),
            "tensor_core_layers": sum(m.tensor_core_decode for m in layers)}


def measure_mode(engine: Engine, args, routing: str, placement: str, seed: int) -> dict:
    """One routing mode on a built engine: routers re-drawn (after the first mode, or for zipf),
    placement calibrated when asked, then TTFT per prompt length and TPOT per concurrency."""
    exponent = args.zipf_exponent if routing == "zipf" else 0.0
    entry: dict = {"routing": routing, "zipf_exponent": exponent, "placement": placement}
    if routing == "zipf" or seed:
        apply_zipf_routing(engine.model, engine.config, exponent, seed=seed)
    offloaded = bool(offloads_of(engine.model))
    if offloaded and placement == "by-use":
        t0 = time.perf_counter()
        entry["calibration"] = calibrate_placement(engine, args.calibration_tokens, seed=seed)
        entry["calibration"]["seconds"] = round(time.perf_counter() - t0, 2)
        print("calibration", entry["calibration"], flush=True)
    reset_use_counts(engine)
    entry["ttft_ms"] = {}
    for length in args.ttft_prompt_lens or [args.prompt_len]:
        entry["ttft_ms"][str(length)] = [round(1e3 * t, 2) for t in measure_ttft(engine, length, args.ttft_repeats, seed)]
        print(routing, "ttft_ms", length, entry["ttft_ms"][str(length)], flush=True)
    entry["tpot"] = []
    for c in args.concurrency:
        entry["tpot"].append(measure_tpot(engine, c, 128, args.output_len, seed))
        print(routing, "tpot", entry["tpot"][-1], flush=True)
    if offloaded:
        entry["measured_use"] = use_summary(torch.stack([o.counts for o in offloads_of(engine.model)]))
    return entry


def _save_json(result: dict, path: str | None) -> None:
    """--json-out: the result so far (rewritten as the run goes on), nothing without a path."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.prefix_len < 0:
        parser.error("--prefix-len must be >= 0")
    if args.prefix_len and args.prefix_len + args.prompt_len >= args.max_model_len:
        parser.error(f"--prefix-len + --prompt-len ({args.prefix_len + args.prompt_len}) must be below "
                     f"--max-model-len ({args.max_model_len}): the turn generates a token")
    lens = args.ttft_prompt_lens or [args.prompt_len]
    t0 = time.perf_counter()
    if args.spec_verify:  # one engine whose window rings hold the largest k; graphs at the concurrencies only
        from v4serve.bench.spec_decode import spec_engine_args

        args.speculative_config, args.cuda_graph_sizes = spec_engine_args(args)
    engine = Engine(engine_args(args))
    _sync()
    load_s = time.perf_counter() - t0
    banner = engine.banner()
    print("\n".join(banner), flush=True)
    moe_decode = moe_decode_summary(engine.model, args.moe_decode)
    print(f"MoE decode: {moe_decode['route']} ({moe_decode['tensor_core_layers']} of {moe_decode['mxfp4_layers']} "
          "MXFP4 expert layers on tensor cores)", flush=True)
    kv_lines, kv_agree = kv_bytes_lines(engine.cache, engine.kv_budget)
    print("\n".join(kv_lines), flush=True)
    result = {"model": args.model, "overrides": args.hf_overrides, "tensor_parallel_size": args.tensor_parallel_size,
              "expert_parallel": args.enable_expert_parallel, "kv_cache_dtype": engine.runner.cache_format.name,
              "kv_bytes_per_token": engine.kv_budget.bytes_per_token, "kv_bytes_agree": kv_agree, "kv_tokens": engine.kv_budget.num_tokens, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "max_num_seqs": engine.scheduler.max_num_seqs,
              "cuda_graph_sizes": engine.decode_runner.ladder, "kv_pages": engine.cache.allocator.num_pages,
              "cuda_graphs": engine.decode_runner.uses_cuda_graphs, "load_s": round(load_s, 2),
              "weights_load_s": round(engine.runner.load_seconds, 2),
              "graph_capture_s": round(engine.runner.capture_seconds, 2),
              "memory": memory_summary(engine.model, engine.kv_budget.total_bytes, engine.cache.device), "banner": banner,
              "offload_overlap": not args.no_offload_overlap, "offload_prefetch": args.offload_prefetch,
              "moe_decode": moe_decode}
    graphs = f"decode CUDA graphs: {result['cuda_graphs']}"
    if engine.spec is not None:  # the speculative steps replace the decode graphs with their own
        result["speculative_cuda_graphs"] = engine.spec.verify_runner.uses_cuda_graphs
        graphs = f"speculative-step CUDA graphs: {result['speculative_cuda_graphs']} (no plain decode graphs)"
    print(f"load {load_s:.1f} s (weights {engine.runner.load_seconds:.1f} s, decode graphs "
          f"{engine.runner.capture_seconds:.1f} s); {graphs}, max_num_seqs: {result['max_num_seqs']}, "
          f"KV pages: {result['kv_pages']}", flush=True)
    if args.spec_verify:
        from v4serve.bench.spec_decode import run_spec_rows

        # Step costs per routing mode (zipf: a verify step's tokens share experts as skewed routing
        # makes them; uniform: ~(k + 1) x top-k experts), end to end in the first mode only.
        result["speculative"] = []
        for seed, routing in enumerate(args.routing):
            exponent = args.zipf_exponent if routing == "zipf" else 0.0
            if routing == "zipf" or seed:
                apply_zipf_routing(engine.model, engine.config, exponent, seed=seed)
            print(f"routing {routing} (zipf exponent {exponent})", flush=True)
            rows = run_spec_rows(engine, args, with_end_to_end=seed == 0)
            result["speculative"].append({"routing": routing, "zipf_exponent": exponent, **rows})
            _save_json(result, args.json_out)
        print(json.dumps(result))
        return 0
    if args.host_profile:
        for c in args.concurrency:
            host_profile(engine, c)
        return 0
    on_gpu = engine.cache.device.type == "cuda"
    if args.prefix_len:
        row = measure_prefix_ttft(engine, args.prefix_len, args.prompt_len, repeats=3)
        result.update(row, max_num_batched_tokens=engine.scheduler.max_num_batched_tokens)
        print(f"TTFT of a {args.prompt_len}-token turn after a {args.prefix_len}-token shared prefix "
              f"(prefix caching {'on' if row['prefix_caching'] else 'off'}): cold {row['ttft_cold_ms_median']:.1f} ms, "
              f"warm {row['ttft_warm_ms_median']:.1f} ms ({row['cold_over_warm']:.2f}x); warm turns found "
              f"{row['warm_cached_tokens']} prompt tokens cached")
        print(json.dumps(result))
        return 0
    if args.profile_only:
        if not on_gpu:
            raise SystemExit("the GPU-idle profile needs a CUDA device")
        for c in args.concurrency:
            print(gpu_busy_fraction(engine, c))
        return 0
    placements = args.placement if len(args.placement) == len(args.routing) else args.placement[:1] * len(args.routing)
    result["modes"] = []
    for seed, (routing, placement) in enumerate(zip(args.routing, placements)):
        result["modes"].append(measure_mode(engine, args, routing, placement, seed))
        _save_json(result, args.json_out)  # after every mode: a run stopped at its time limit keeps the modes done
    first = result["modes"][0]
    result["ttft_ms"], result["tpot"] = first["ttft_ms"][str(lens[0])], first["tpot"]
    result["profile"] = [gpu_busy_fraction(engine, c) for c in args.concurrency] if on_gpu and not args.no_profile else []
    result["decode_continuations"] = engine.decode_continuations
    if engine.spec is not None:  # vLLM's spec-decode counters over the whole run
        m = engine.spec.metrics
        result["spec_decode"] = {"num_drafts": m.num_drafts, "num_draft_tokens": m.num_draft_tokens,
                                 "num_accepted_tokens": m.num_accepted_tokens,
                                 "accepted_per_position": m.accepted_per_position,
                                 "mean_acceptance_length": m.mean_acceptance_length}
        print("spec_decode", result["spec_decode"])
    print(f"load {load_s:.1f} s; memory (GiB): " + ", ".join(f"{k} {v}" for k, v in result["memory"].items()))
    for mode in result["modes"]:
        print(f"routing {mode['routing']} (placement {mode['placement']}): TTFT median "
              + ", ".join(f"{n}: {statistics.median(t):.1f} ms" for n, t in mode["ttft_ms"].items())
              + (f"; measured use {mode['measured_use']}" if "measured_use" in mode else ""))
        print(f"{'concurrency':>11} {'TPOT ms':>8} {'max ms':>8} {'out tok/s':>10} {'fetch/step':>10}")
        for row in mode["tpot"]:
            print(f"{row['concurrency']:>11} {row['tpot_ms']:>8.2f} {row['tpot_max_ms']:>8.2f} "
                  f"{row['output_tok_s']:>10.1f} {row.get('expert_fetches_per_step', '-'):>10}")
    for row in result["profile"]:
        print(f"decode step @{row['concurrency']}: {row['kernels_per_step']:.0f} kernels, GPU busy "
              f"{row['gpu_busy_ms_per_step']:.2f} ms of a {row['span_ms_per_step']:.2f} ms timeline span: idle "
              f"{100 * row['idle_fraction']:.1f}% (of host wall time {row['wall_ms_per_step']:.2f} ms: "
              f"{100 * row['idle_fraction_wall']:.1f}%); unprofiled {row['wall_ms_per_step_unprofiled']:.2f} ms per "
              f"step: idle {100 * row['idle_fraction_unprofiled']:.1f}%")
    _save_json(result, args.json_out)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
