"""Speculative decoding on the GPU: what a verify step costs beside a plain decode step, and the
TPOT it gives at forced acceptance lengths (issue #21).

    python -m v4serve.bench.engine --spec-verify --concurrency 1 8 32 --output-len 128 \\
        [--spec-k 1 2 3 4] [--spec-lengths 2.0 2.8 3.5] [--spec-e2e-k 3] [--spec-profile]

One engine (`deepseek-v4-flash` cut to 8 layers by default, random weights), built with
speculative decoding at k = max(--spec-k) (window rings of W + k rows) and CUDA graphs at the
concurrencies only.

* **Step costs.** For each concurrency c: c requests of 128-token prompts are prefilled; at their
  next positions the plain decode graph of size c (a `DecodeRunner` on the same model and cache)
  and, for each k, the verify graph and the commit + draft graph (`engine/verify_runner.py`) are
  replayed, alone and back to back, timed with CUDA events (median of 5 repeats of 10 replays).
  The replays rewrite the same rows again and again; the requests are aborted afterwards. Every
  graph is timed in the same process (over four captured graphs: each replays ~0.3 us per kernel
  slower, docs/performance.md "four-graph effect", plain and speculative alike).
  A step of k drafts at mean acceptance length L gives L tokens per sequence, so its TPOT is
  (verify + commit/draft) / L, against plain decode's one token per step. `--spec-profile` adds,
  per k, the kernels whose time grows most from the plain step to the verify step (torch profiler
  over 10 replays of each graph). Every timed step must replay a CUDA graph on the GPU (as
  production does; the bench refuses to time an eager one). The step costs run once per
  `--routing` mode on the same engine (`--routing uniform zipf`), and once per `--spec-rows32` rule
  (the FP8 linears' kernel at 17..32 rows, which a verify step of c8 k = 3 runs: its K split summed
  by a second launch, or by the last program of each tile; graphs captured anew under each): zipf re-draws the routers
  (Zipf(--zipf-exponent) expected expert use, as in the end-to-end Flash runs), so a verify step's
  k + 1 tokens share experts as skewed routing makes them, where uniform random routers send them
  to ~(k + 1) x 6.
* **End to end** at k = --spec-e2e-k (in the first routing mode only): per concurrency, a greedy run with the MTP draft (random
  weights: ~nothing accepted) records each request's output, then one run per L with the
  `ForcedAcceptance` draft (`bench/forced_draft.py`) over the same prompts: TPOT as a client sees it
  (`measure_tpot`) and vLLM's spec-decode counters of that run.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import time

import torch

from v4serve.bench.engine import measure_tpot
from v4serve.bench.forced_draft import ForcedAcceptance
from v4serve.engine import Engine, SamplingParams
from v4serve.engine.decode_runner import DecodeRunner
from v4serve.engine.spec_metrics import SpecDecodeMetrics
from v4serve.ops import fp8_linear_triton

# W8A16 linears at 17..32 rows (fp8_linear_triton.W8A16_ROWS32_OTHERWISE): the rules the step costs compare
ROWS32_RULES = {"production": None, "sum-kernel": dict(KERNEL="tiles", SUM_LAST=False),
                "sum-last": dict(KERNEL="tiles", SUM_LAST=True)}

PROMPT_LEN = 128


def spec_engine_args(args) -> tuple[dict, list[int]]:
    """(speculative_config, cuda_graph_sizes) of the benchmark's engine (with the FP8 draft head
    when any row times it; the "shared" rows then set it aside: `draft_head_choice`)."""
    k = max(max(args.spec_k), args.spec_e2e_k)
    head = "fp8" if "fp8" in args.spec_draft_head else "shared"
    return {"method": "mtp", "num_speculative_tokens": k, "draft_head": head}, sorted(set(args.concurrency))


@contextlib.contextmanager
def draft_head_choice(model, name: str):
    """While open, the MTP drafts read the lm head ("shared") or the model's FP8 draft head ("fp8");
    graphs captured inside keep the choice."""
    kept = model.draft_head
    if name == "fp8" and kept is None:
        raise ValueError("the fp8 draft head rows need an engine built with draft_head \"fp8\"")
    model.draft_head = kept if name == "fp8" else None
    try:
        yield
    finally:
        model.draft_head = kept


@contextlib.contextmanager
def rows32_rule(name: str):
    """While open, the W8A16 linears at 17..32 rows take ROWS32_RULES[name] (fp8_linear_triton reads its
    rule when a step is traced, so graphs captured inside keep it): a measuring switch for this bench."""
    choice, kept = ROWS32_RULES[name], fp8_linear_triton.W8A16_ROWS32_OTHERWISE
    if choice is not None:
        fp8_linear_triton.W8A16_ROWS32_OTHERWISE = choice
    try:
        yield
    finally:
        fp8_linear_triton.W8A16_ROWS32_OTHERWISE = kept


def replay_ms(replay, repeats: int = 5, iterations: int = 10) -> float:
    """Median over `repeats` of the mean time of `iterations` back-to-back calls (CUDA events on
    CUDA; on the CPU, where nothing is captured, wall time: a smoke run of the code path)."""
    for _ in range(3):
        replay()
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iterations):
                replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / iterations)
        else:
            begin = time.perf_counter()
            for _ in range(iterations):
                replay()
            times.append(1e3 * (time.perf_counter() - begin) / iterations)
    return statistics.median(times)


def _graph_or_eager(graphs: dict, size: int, index: int, eager):
    """The replay of graph `graphs[size][index]`, or `eager` where nothing was captured."""
    return graphs[size][index].replay if size in graphs else eager


def _require_graphs(on_gpu: bool, what: str, graphs: dict, size: int) -> bool:
    """Whether `what` replays a CUDA graph of `size` rows; on the GPU an eager step is refused: a
    measurement of the steps production replays as graphs must time graphs too."""
    if on_gpu and size not in graphs:
        raise RuntimeError(f"{what} at {size} rows has no CUDA graph: the step would be timed eagerly")
    return size in graphs


def _decoding_requests(engine: Engine, c: int) -> list:
    """c requests of PROMPT_LEN random tokens, stepped until every one decodes."""
    gen = torch.Generator().manual_seed(1000 + c)
    params = SamplingParams(temperature=0.0, max_tokens=1024, ignore_eos=True)
    ids = [f"step-{c}-{i}" for i in range(c)]
    for rid in ids:
        engine.add_request(rid, torch.randint(10, 1000, (PROMPT_LEN,), generator=gen).tolist(), params)
    while any(not engine._requests[rid].output_token_ids for rid in ids):
        engine.step()
    return [engine._requests[rid] for rid in ids]


def kernel_times(replay, iterations: int = 10) -> dict[str, tuple[float, float]]:
    """kernel name -> (launches, µs) per call of `replay` (CUDA graphs included), from a profiled
    run of `iterations` calls: where a step's time goes, kernel by kernel."""
    from torch.profiler import ProfilerActivity, profile

    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iterations):
            replay()
        torch.cuda.synchronize()
    table: dict[str, tuple[float, float]] = {}
    for e in prof.events():
        if e.device_type.name == "CUDA":
            n, us = table.get(e.name[:60], (0.0, 0.0))
            table[e.name[:60]] = (n + 1 / iterations, us + (e.time_range.end - e.time_range.start) / iterations)
    return table


def kernel_growth(plain: dict, verify: dict, top: int = 12) -> list[tuple[str, float, float, float, float]]:
    """(name, plain launches, plain µs, verify launches, verify µs) of the kernels whose time grows
    most from a plain decode step to a verify step."""
    names = sorted(set(plain) | set(verify), key=lambda n: plain.get(n, (0, 0))[1] - verify.get(n, (0, 0))[1])
    return [(n, *(round(v, 1) for v in plain.get(n, (0.0, 0.0))), *(round(v, 1) for v in verify.get(n, (0.0, 0.0))))
            for n in names[:top]]


def step_costs(engine: Engine, concurrencies: list[int], ks: list[int], profile: bool = False) -> list[dict]:
    """Per concurrency c: the plain decode graph's time and, per k, the two speculative graphs' (the
    first c of max(concurrencies) decoding requests, at their next positions). `profile`: also the
    kernels whose time grows most from the plain step to the verify step (`kernel_growth`)."""
    spec = engine.spec
    on_gpu = engine.cache.device.type == "cuda"
    requests = _decoding_requests(engine, max(concurrencies))
    starts = [r.num_tokens - 1 for r in requests]  # the position each sequence computes next
    slots = [r.slot for r in requests]
    last = [r.all_token_ids[-1] for r in requests]
    rows = []
    for c in concurrencies:
        plain = DecodeRunner(engine.model, engine.cache, c, use_cuda_graphs=on_gpu, graph_sizes=(c,))
        plain.run(last[:c], starts[:c], slots[:c])
        graphed = _require_graphs(on_gpu, "the plain decode step", plain._graphs, c)
        plain_replay = _graph_or_eager(plain._graphs, c, 0, functools.partial(plain._forward, c))
        rows.append({"concurrency": c, "k": [], "plain_ms": replay_ms(plain_replay), "plain_graph": graphed})
        if profile:
            rows[-1]["plain_kernels"] = kernel_times(plain_replay)
        del plain, plain_replay
    for k in ks:
        spec.set_num_speculative_tokens(k)
        runner = spec.verify_runner
        for row in rows:
            c = row["concurrency"]
            outputs = runner.verify([[t] * (k + 1) for t in last[:c]], starts[:c], slots[:c])  # c: a graph size
            runner.commit_and_draft([0] * c)
            graphed = _require_graphs(on_gpu, f"the k={k} verify step", runner._graphs, c)
            verify = _graph_or_eager(runner._graphs, c, 0, lambda: runner._verify(c))
            after = _graph_or_eager(runner._graphs, c, 2, lambda: runner._commit_and_draft(c, outputs))
            verify_ms, after_ms = replay_ms(verify), replay_ms(after)
            both_ms = replay_ms(lambda: (verify(), after()))
            row["k"].append({"k": k, "verify_ms": verify_ms, "commit_draft_ms": after_ms, "step_ms": both_ms,
                             "step_over_plain": both_ms / row["plain_ms"], "verify_over_plain": verify_ms / row["plain_ms"],
                             "graphs": graphed})
            if profile:
                row["k"][-1]["kernel_growth"] = kernel_growth(row["plain_kernels"], kernel_times(verify))
    for r in requests:
        engine.abort(r.request_id)
    for row in rows:
        row.pop("plain_kernels", None)
    return rows


def end_to_end(engine: Engine, c: int, k: int, lengths: list[float], output_len: int) -> list[dict]:
    spec = engine.spec
    spec.set_num_speculative_tokens(k)
    spec.draft_filter = None
    reference: dict[str, list[int]] = {}
    plain_like = measure_tpot(engine, c, PROMPT_LEN, output_len, outputs=reference)
    rows = [{"concurrency": c, "k": k, "forced_length": None, "tpot_ms": plain_like["tpot_ms"],
             **_counters(spec.metrics)}]
    for length in lengths:
        spec.metrics = SpecDecodeMetrics()
        spec.draft_filter = ForcedAcceptance(reference, k, length, engine.config.vocab_size)
        outputs: dict[str, list[int]] = {}
        device_steps, eager_steps = spec.device_steps, spec.eager_steps
        tpot = measure_tpot(engine, c, PROMPT_LEN, output_len, outputs=outputs)
        rows.append({"concurrency": c, "k": k, "forced_length": length, "tpot_ms": tpot["tpot_ms"],
                     "output_tok_s": tpot["output_tok_s"], "same_tokens": outputs == reference,
                     "device_steps": spec.device_steps - device_steps, "eager_steps": spec.eager_steps - eager_steps,
                     **_counters(spec.metrics)})
    spec.draft_filter, spec.metrics = None, SpecDecodeMetrics()
    return rows


def _counters(m: SpecDecodeMetrics) -> dict:
    return {"num_drafts": m.num_drafts, "num_draft_tokens": m.num_draft_tokens,
            "num_accepted_tokens": m.num_accepted_tokens, "accepted_per_position": list(m.accepted_per_position),
            "mean_acceptance_length": round(m.mean_acceptance_length, 3)}


def run_spec_rows(engine: Engine, args, with_end_to_end: bool = True) -> dict:
    """Step costs at every concurrency and k on `engine` as its routers stand (`with_end_to_end`:
    also the TPOT rows)."""
    if not engine.spec.verify_runner.uses_cuda_graphs:
        print("no CUDA graphs captured: the times below are eager steps (a smoke run, not a measurement)")
    profile = args.spec_profile and engine.cache.device.type == "cuda"  # CUDA kernels only
    costs = []
    for rule in args.spec_rows32:
        for head in args.spec_draft_head:
            with rows32_rule(rule), draft_head_choice(engine.model, head):
                costs += [{"rows32_rule": rule, "draft_head": head, **row}
                          for row in step_costs(engine, sorted(set(args.concurrency)), args.spec_k, profile=profile)]
    for row in costs:
        print(f"c={row['concurrency']} (17..32-row FP8 linears: {row['rows32_rule']}; draft head: "
              f"{row['draft_head']}): plain decode step "
              f"{row['plain_ms']:.3f} ms "
              f"({'CUDA graph' if row['plain_graph'] else 'eager'})", flush=True)
        for r in row["k"]:
            tpot = "  ".join(f"L={L}: {r['step_ms'] / L:.3f} ms ({r['step_ms'] / L / row['plain_ms']:.2f}x)"
                             for L in args.spec_lengths if L <= r["k"] + 1)
            print(f"  k={r['k']}: verify {r['verify_ms']:.3f} ({r['verify_over_plain']:.2f}x plain) + commit/draft "
                  f"{r['commit_draft_ms']:.3f} = {r['step_ms']:.3f} ms ({r['step_over_plain']:.2f}x plain, "
                  f"{'CUDA graphs' if r['graphs'] else 'eager'}); TPOT {tpot}", flush=True)
            for name, n0, us0, n1, us1 in r.get("kernel_growth", ()):
                print(f"    {name:60s} plain {n0:6.1f} x {us0:8.1f} µs   verify {n1:6.1f} x {us1:8.1f} µs", flush=True)
    e2e = []
    lengths = [L for L in args.spec_lengths if L <= args.spec_e2e_k + 1]
    for c in sorted(set(args.concurrency)) if with_end_to_end else ():
        with draft_head_choice(engine.model, args.spec_draft_head[-1]):
            rows = [{"draft_head": args.spec_draft_head[-1], **row}
                    for row in end_to_end(engine, c, args.spec_e2e_k, lengths, args.output_len)]
        for row in rows:
            print("e2e", row, flush=True)
        e2e += rows
    return {"step_costs": costs, "end_to_end": e2e}
