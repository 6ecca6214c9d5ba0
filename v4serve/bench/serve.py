"""`v4serve bench serve`: load on a running server, measured from the client.

Requests are streamed `/v1/completions` calls with token-id prompts and `ignore_eos`, so each
produces exactly `--output-len` tokens. The prompts come from a workload (`bench/workloads.py`,
`--dataset-name`): `random` (every prompt its own), `prefix_repetition` (vLLM's: prompts sharing
a few long prefixes) or `multi_turn` (conversations after a shared system prompt, each turn's
prompt the whole conversation so far). A workload is a list of sessions (a conversation, or one
request); at most `--concurrency` sessions run at once, each sending its turns one after
another; new sessions start at `--request-rate` per second (Poisson arrivals; `inf` starts them
as fast as slots free up). `--num-warmups` requests go first, outside the figures.

Per request: TTFT (request sent to first token), TPOT ((latency - TTFT) / (tokens - 1)) and
end-to-end latency, also grouped by the workload's labels ("new prefix" / "repeated prefix",
"turn 1", "turn 2", ...). The server's prefix-cache hit rate is read from `/metrics` before and
after the run (`v4serve_prefix_cache_queries_total` / `_hits_total`, or vLLM's
`vllm:prefix_cache_*`): hits / queries of the run's prompt tokens. A table follows, then one JSON line.

    v4serve serve --model tiny --device cpu &
    v4serve bench serve --num-requests 32 --concurrency 8 --prompt-len 64 --output-len 16
    v4serve bench serve --dataset-name multi_turn --num-conversations 8 --num-turns 4 \\
        --common-prefix-num-tokens 1024 --turn-num-tokens 128 --output-len 32 --concurrency 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass

import httpx

from v4serve.bench.workloads import (Session, multi_turn_workload, prefix_repetition_workload, random_ids,
                                     random_workload)

PERCENTILES = (50, 90, 99)
DATASETS = ("random", "prefix_repetition", "multi_turn")
DEFAULT_NUM_REQUESTS = 64
# Counter names of the prefix cache, in prompt tokens: v4serve's, then vLLM's (labelled samples summed).
PREFIX_CACHE_QUERIES = ("v4serve_prefix_cache_queries_total", "vllm:prefix_cache_queries_total")
PREFIX_CACHE_HITS = ("v4serve_prefix_cache_hits_total", "vllm:prefix_cache_hits_total")


@dataclass
class Result:
    ttft: float  # seconds
    latency: float
    output_tokens: int
    prompt_tokens: int
    error: str | None = None
    label: str = ""

    @property
    def tpot(self) -> float | None:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else None


async def one_request(http: httpx.AsyncClient, url: str, body: dict) -> Result:
    start = time.perf_counter()
    ttft, usage = None, {}
    try:
        async with http.stream("POST", url + "/v1/completions", json=body) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode(errors="replace")
                return Result(0.0, 0.0, 0, 0, f"HTTP {response.status_code}: {text[:200]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if ttft is None and any(c.get("text") for c in chunk.get("choices", ())):
                    ttft = time.perf_counter() - start
                usage = chunk.get("usage") or usage
    except httpx.HTTPError as e:
        return Result(0.0, 0.0, 0, 0, f"{type(e).__name__}: {e}")
    latency = time.perf_counter() - start
    return Result(ttft if ttft is not None else latency, latency, usage.get("completion_tokens", 0),
                  usage.get("prompt_tokens", 0))


def request_body(model: str, prompt: list[int], args: argparse.Namespace, seed: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": args.output_len, "ignore_eos": True,
            "temperature": args.temperature, "seed": seed, "stream": True, "stream_options": {"include_usage": True}}


def prefix_cache_counters(exposition: str) -> tuple[float, float] | None:
    """(queries, hits) of the prefix cache from a Prometheus text exposition, None if it has neither."""
    queries = hits = None
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition(" ")
        name = name.split("{", 1)[0]
        if name in PREFIX_CACHE_QUERIES:
            queries = (queries or 0.0) + float(rest.split()[-1])
        elif name in PREFIX_CACHE_HITS:
            hits = (hits or 0.0) + float(rest.split()[-1])
    return None if queries is None or hits is None else (queries, hits)


async def scrape_prefix_cache(http: httpx.AsyncClient, url: str) -> tuple[float, float] | None:
    try:
        response = await http.get(url + "/metrics")
    except httpx.HTTPError:
        return None
    return prefix_cache_counters(response.text) if response.status_code == 200 else None


async def wait_until_ready(http: httpx.AsyncClient, url: str, timeout_s: float) -> None:
    """Poll /health until it answers 200 (a server still building its engine refuses connections)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if (await http.get(url + "/health", timeout=5)).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url}/health did not answer 200 within {timeout_s:g} s")
        await asyncio.sleep(1.0)


@dataclass
class Run:
    results: list[Result]
    duration: float
    model: str
    prefix_cache: tuple[float, float] | None  # (queries, hits) over the run, from /metrics


async def run(args: argparse.Namespace, sessions: list[Session]) -> Run:
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=args.concurrency + 1, max_keepalive_connections=args.concurrency + 1)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as http:
        if args.ready_check_timeout_sec > 0:
            await wait_until_ready(http, args.url, args.ready_check_timeout_sec)
        model = args.model or (await http.get(args.url + "/v1/models")).json()["data"][0]["id"]
        warmup_rng = random.Random(f"warmup-{args.seed}")  # prompts that share nothing with the workload
        for i in range(args.num_warmups):
            prompt = random_ids(warmup_rng, len(sessions[0][0].prompt))
            body = request_body(model, prompt, args, seed=args.seed + args.num_requests + i)
            await one_request(http, args.url, body)
        before = await scrape_prefix_cache(http, args.url)
        slots = asyncio.Semaphore(args.concurrency)
        first_seed = [args.seed]  # request i of the workload (in session order) samples with seed + i
        for session in sessions[:-1]:
            first_seed.append(first_seed[-1] + len(session))

        async def run_session(session: Session, seed: int) -> list[Result]:
            async with slots:
                out = []
                for t, turn in enumerate(session):
                    result = await one_request(http, args.url, request_body(model, turn.prompt, args, seed + t))
                    result.label = turn.label
                    out.append(result)
                return out

        tasks = []
        start = time.perf_counter()
        for i, session in enumerate(sessions):
            tasks.append(asyncio.create_task(run_session(session, first_seed[i])))
            if args.request_rate != float("inf") and i + 1 < len(sessions):
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = [r for session_results in await asyncio.gather(*tasks) for r in session_results]
        duration = time.perf_counter() - start
        after = await scrape_prefix_cache(http, args.url)
        counters = None if before is None or after is None else (after[0] - before[0], after[1] - before[1])
        return Run(results, duration, model, counters)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize(outcome: Run, args: argparse.Namespace) -> dict:
    results, duration = outcome.results, outcome.duration
    ok = [r for r in results if r.error is None]
    out_tokens = sum(r.output_tokens for r in ok)
    summary = {
        "model": outcome.model, "url": args.url, "dataset": args.dataset_name, "workload": workload_knobs(args),
        "num_requests": len(results), "failed": len(results) - len(ok),
        "concurrency": args.concurrency, "request_rate": args.request_rate, "output_len": args.output_len,
        "prompt_tokens_mean": _mean([r.prompt_tokens for r in ok]), "duration_s": duration,
        "output_tokens_per_s": out_tokens / duration if duration else 0.0,
        "total_tokens_per_s": (out_tokens + sum(r.prompt_tokens for r in ok)) / duration if duration else 0.0,
        "requests_per_s": len(ok) / duration if duration else 0.0,
    }
    for name, values in (("ttft_ms", [r.ttft * 1e3 for r in ok]),
                         ("tpot_ms", [r.tpot * 1e3 for r in ok if r.tpot is not None]),
                         ("latency_ms", [r.latency * 1e3 for r in ok])):
        summary[f"{name}_mean"] = _mean(values)
        for p in PERCENTILES:
            summary[f"{name}_p{p}"] = percentile(values, p)
    labels = list(dict.fromkeys(r.label for r in results if r.label))  # in first-seen order
    summary["ttft_ms_by_label"] = [
        {"label": label, "count": len(ttfts), "ttft_ms_mean": _mean(ttfts),
         **{f"ttft_ms_p{p}": percentile(ttfts, p) for p in PERCENTILES}}
        for label in labels for ttfts in [[r.ttft * 1e3 for r in ok if r.label == label]]
    ]
    queries, hits = outcome.prefix_cache or (None, None)
    summary["prefix_cache_queries"] = queries
    summary["prefix_cache_hits"] = hits
    summary["prefix_cache_hit_rate"] = hits / queries if queries else None
    summary["errors"] = sorted({r.error for r in results if r.error})[:5]
    summary["metadata"] = dict(args.metadata)
    return summary


def print_table(s: dict) -> None:
    knobs = ", ".join(f"{k} {v}" for k, v in s["workload"].items())
    print(f"# {s['num_requests']} requests ({s['failed']} failed) to {s['model']} at {s['url']}: {s['dataset']} "
          f"({knobs}), concurrency {s['concurrency']}, rate {s['request_rate']}/s, output {s['output_len']}")
    print(f"{'duration':<18} {s['duration_s']:10.2f} s")
    print(f"{'output tokens/s':<18} {s['output_tokens_per_s']:10.1f}")
    print(f"{'total tokens/s':<18} {s['total_tokens_per_s']:10.1f}")
    print(f"{'requests/s':<18} {s['requests_per_s']:10.2f}")
    rate = s["prefix_cache_hit_rate"]
    print(f"{'prefix cache hits':<18} " + ("n/a (no counters, or no prompt tokens looked up)" if rate is None else
                                          f"{100 * rate:9.1f}% of {s['prefix_cache_queries']:.0f} prompt tokens"))
    print(f"{'':<18} {'mean':>10} " + " ".join(f"{'p' + str(p):>10}" for p in PERCENTILES))
    for name in ("ttft_ms", "tpot_ms", "latency_ms"):
        cells = " ".join(f"{s[f'{name}_p{p}']:10.1f}" for p in PERCENTILES)
        print(f"{name:<18} {s[f'{name}_mean']:10.1f} {cells}")
    if s["ttft_ms_by_label"]:
        width = max(18, *(len(row["label"]) for row in s["ttft_ms_by_label"]))
        print(f"{'ttft_ms by label':<{width}} {'mean':>10} " + " ".join(f"{'p' + str(p):>10}" for p in PERCENTILES))
        for row in s["ttft_ms_by_label"]:
            cells = " ".join(f"{row[f'ttft_ms_p{p}']:10.1f}" for p in PERCENTILES)
            print(f"{row['label']:<{width}} {row['ttft_ms_mean']:10.1f} {cells}   ({row['count']} requests)")
    for error in s["errors"]:
        print(f"error: {error}")


def workload_knobs(args: argparse.Namespace) -> dict:
    if args.dataset_name == "prefix_repetition":
        return {"prefix_len": args.prefix_repetition_prefix_len, "suffix_len": args.prefix_repetition_suffix_len,
                "num_prefixes": args.prefix_repetition_num_prefixes}
    if args.dataset_name == "multi_turn":
        return {"num_conversations": args.num_conversations, "num_turns": args.num_turns,
                "common_prefix_num_tokens": args.common_prefix_num_tokens,
                "prefix_num_tokens": args.prefix_num_tokens, "turn_num_tokens": args.turn_num_tokens}
    return {"prompt_len": args.prompt_len}


def build_workload(args: argparse.Namespace) -> list[Session]:
    if args.dataset_name == "prefix_repetition":
        return prefix_repetition_workload(args.num_requests, args.prefix_repetition_prefix_len,
                                          args.prefix_repetition_suffix_len, args.prefix_repetition_num_prefixes,
                                          args.seed)
    if args.dataset_name == "multi_turn":
        return multi_turn_workload(args.num_conversations, args.num_turns, args.common_prefix_num_tokens,
                                   args.prefix_num_tokens, args.turn_num_tokens, args.output_len, args.seed)
    return random_workload(args.num_requests, args.prompt_len, args.seed)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="v4serve bench serve", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server to load")
    parser.add_argument("--model", default=None, help="None: the first model of /v1/models")
    parser.add_argument("--dataset-name", choices=DATASETS, default="random", help="the workload (bench/workloads.py)")
    parser.add_argument("--num-requests", "--num-prompts", type=int, default=None,
                        help=f"requests in all (None: {DEFAULT_NUM_REQUESTS}; multi_turn: conversations x turns)")
    parser.add_argument("--concurrency", "--max-concurrency", type=int, default=8,
                        help="sessions in flight at once (a multi_turn conversation sends one turn at a time)")
    parser.add_argument("--request-rate", type=float, default=float("inf"),
                        help="sessions started per second (inf: as fast as slots free up)")
    parser.add_argument("--output-len", type=int, default=64, help="tokens generated per request (every dataset)")
    parser.add_argument("--num-warmups", type=int, default=0,
                        help="requests sent first and left out of the figures (fresh prompts as long as the "
                             "workload's first: kernels compile, nothing shared with the workload)")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts; request i samples with seed + i")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--ready-check-timeout-sec", type=float, default=0.0,
                        help="first wait up to this long for /health to answer 200 (0: do not wait)")
    parser.add_argument("--metadata", type=_key_value, nargs="*", default=[], metavar="KEY=VALUE",
                        help="pairs copied into the JSON line (what was run: e.g. prefix_caching=off)")
    parser.add_argument("--json", default=None, help="also write the JSON line to this file")
    random_group = parser.add_argument_group("random")
    random_group.add_argument("--prompt-len", "--random-input-len", type=int, default=128, help="prompt tokens")
    prefix = parser.add_argument_group("prefix_repetition (vLLM's names)")
    prefix.add_argument("--prefix-repetition-prefix-len", type=int, default=8192, help="tokens of each shared prefix")
    prefix.add_argument("--prefix-repetition-suffix-len", type=int, default=128,
                        help="tokens after the prefix, each prompt its own")
    prefix.add_argument("--prefix-repetition-num-prefixes", type=int, default=1,
                        help="distinct prefixes (num_requests // num_prefixes prompts each)")
    multi = parser.add_argument_group("multi_turn (names of vLLM's multi-turn benchmark's generator)")
    multi.add_argument("--num-conversations", type=int, default=8, help="conversations")
    multi.add_argument("--num-turns", type=int, default=4, help="user turns per conversation")
    multi.add_argument("--common-prefix-num-tokens", type=int, default=8192,
                       help="tokens of the system prompt every conversation starts with")
    multi.add_argument("--prefix-num-tokens", type=int, default=0,
                       help="tokens after it, each conversation its own")
    multi.add_argument("--turn-num-tokens", type=int, default=128, help="tokens of each user turn")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.dataset_name == "multi_turn":
        if args.num_requests is not None:
            parser.error("--num-requests: multi_turn sends --num-conversations x --num-turns requests")
        args.num_requests = args.num_conversations * args.num_turns
    elif args.num_requests is None:
        args.num_requests = DEFAULT_NUM_REQUESTS
    for name in ("num_requests", "concurrency", "prompt_len", "output_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.num_warmups < 0:
        parser.error("--num-warmups must be >= 0")
    if not args.request_rate > 0:
        parser.error("--request-rate must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        sessions = build_workload(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        outcome = asyncio.run(run(args, sessions))
    except (httpx.HTTPError, TimeoutError) as e:
        print(f"error: cannot reach {args.url}: {e}", file=sys.stderr)
        return 2
    summary = summarize(outcome, args)
    print_table(summary)
    line = json.dumps(_finite(summary))
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 1 if summary["failed"] else 0


def _finite(value):
    """The summary with NaN / inf as null (JSON has neither)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
