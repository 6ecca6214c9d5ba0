"""`v4serve bench serve`: load on a running server, measured from the client.

Requests are streamed `/v1/completions` calls with random token-id prompts of exactly
`--prompt-len` tokens and `ignore_eos`, so each produces exactly `--output-len` tokens. At most
`--concurrency` are in flight; new ones start at `--request-rate` per second (Poisson arrivals;
`inf` starts them as fast as slots free up). Per request: TTFT (request sent to first token),
TPOT ((latency - TTFT) / (tokens - 1)) and end-to-end latency. A table of throughput and
percentiles follows, then one JSON line.

    v4serve serve --model tiny --device cpu &
    v4serve bench serve --num-requests 32 --concurrency 8 --prompt-len 64 --output-len 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import math
from dataclasses import dataclass

import httpx

PERCENTILES = (50, 90, 99)


@dataclass
class Result:
    ttft: float  # seconds
    latency: float
    output_tokens: int
    prompt_tokens: int
    error: str | None = None

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


async def run(args: argparse.Namespace) -> tuple[list[Result], float, str]:
    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=args.concurrency, max_keepalive_connections=args.concurrency)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as http:
        model = args.model or (await http.get(args.url + "/v1/models")).json()["data"][0]["id"]
        slots = asyncio.Semaphore(args.concurrency)

        async def limited(body: dict) -> Result:
            async with slots:
                return await one_request(http, args.url, body)

        tasks = []
        start = time.perf_counter()
        for i in range(args.num_requests):
            body = {"model": model, "prompt": [rng.randrange(1000, 100000) for _ in range(args.prompt_len)],
                    "max_tokens": args.output_len, "ignore_eos": True, "temperature": args.temperature,
                    "seed": args.seed + i, "stream": True, "stream_options": {"include_usage": True}}
            tasks.append(asyncio.create_task(limited(body)))
            if args.request_rate != float("inf") and i + 1 < args.num_requests:
                await asyncio.sleep(rng.expovariate(args.request_rate))
        results = await asyncio.gather(*tasks)
        return results, time.perf_counter() - start, model


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summarize(results: list[Result], duration: float, args: argparse.Namespace, model: str) -> dict:
    ok = [r for r in results if r.error is None]
    out_tokens = sum(r.output_tokens for r in ok)
    summary = {
        "model": model, "url": args.url, "num_requests": len(results), "failed": len(results) - len(ok),
        "concurrency": args.concurrency, "request_rate": args.request_rate, "prompt_len": args.prompt_len,
        "output_len": args.output_len, "duration_s": duration,
        "output_tokens_per_s": out_tokens / duration if duration else 0.0,
        "total_tokens_per_s": (out_tokens + sum(r.prompt_tokens for r in ok)) / duration if duration else 0.0,
        "requests_per_s": len(ok) / duration if duration else 0.0,
    }
    for name, values in (("ttft_ms", [r.ttft * 1e3 for r in ok]),
                         ("tpot_ms", [r.tpot * 1e3 for r in ok if r.tpot is not None]),
                         ("latency_ms", [r.latency * 1e3 for r in ok])):
        summary[f"{name}_mean"] = sum(values) / len(values) if values else float("nan")
        for p in PERCENTILES:
            summary[f"{name}_p{p}"] = percentile(values, p)
    summary["errors"] = sorted({r.error for r in results if r.error})[:5]
    return summary


def print_table(s: dict) -> None:
    print(f"# {s['num_requests']} requests ({s['failed']} failed) to {s['model']} at {s['url']}, "
          f"concurrency {s['concurrency']}, rate {s['request_rate']}/s, prompt {s['prompt_len']}, "
          f"output {s['output_len']}")
    print(f"{'duration':<18} {s['duration_s']:10.2f} s")
    print(f"{'output tokens/s':<18} {s['output_tokens_per_s']:10.1f}")
    print(f"{'total tokens/s':<18} {s['total_tokens_per_s']:10.1f}")
    print(f"{'requests/s':<18} {s['requests_per_s']:10.2f}")
    print(f"{'':<18} {'mean':>10} " + " ".join(f"{'p' + str(p):>10}" for p in PERCENTILES))
    for name in ("ttft_ms", "tpot_ms", "latency_ms"):
        cells = " ".join(f"{s[f'{name}_p{p}']:10.1f}" for p in PERCENTILES)
        print(f"{name:<18} {s[f'{name}_mean']:10.1f} {cells}")
    for error in s["errors"]:
        print(f"error: {error}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="v4serve bench serve", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the server to load")
    parser.add_argument("--model", default=None, help="None: the first model of /v1/models")
    parser.add_argument("--num-requests", type=int, default=64, help="requests in all")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight at once")
    parser.add_argument("--request-rate", type=float, default=float("inf"), help="requests per second (inf: all)")
    parser.add_argument("--prompt-len", type=int, default=128, help="prompt tokens per request")
    parser.add_argument("--output-len", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random prompts; request i samples with seed + i")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    parser.add_argument("--json", default=None, help="also write the JSON line to this file")
    args = parser.parse_args(argv)
    for name in ("num_requests", "concurrency", "prompt_len", "output_len"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if not args.request_rate > 0:
        parser.error("--request-rate must be > 0")
    try:
        results, duration, model = asyncio.run(run(args))
    except httpx.HTTPError as e:
        print(f"error: cannot reach {args.url}: {e}", file=sys.stderr)
        return 2
    summary = summarize(results, duration, args, model)
    print_table(summary)
    line = json.dumps({k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in summary.items()})
    print(line)
    if args.json:
        with open(args.json, "w") as f:
            f.write(line + "\n")
    return 1 if summary["failed"] else 0

