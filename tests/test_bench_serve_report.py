"""`bench serve`'s report without a server: the prefix-cache counters read from a /metrics text
(v4serve's own renderer, vLLM's labelled names), the summary's per-label TTFT and hit rate, the
flags (vLLM's aliases, multi_turn's request count), the ready check."""

import asyncio
import json
import socket

import httpx
import pytest

from v4serve.bench import serve as bench_serve
from v4serve.server.engine_loop import EngineSnapshot
from v4serve.server.metrics import Metrics


def test_counters_read_from_v4serves_own_metrics_page():
    snapshot = EngineSnapshot(running=1, waiting=0, pages_used=3, pages_total=9, preemptions=0, alive=True,
                              prefix_cache_queries=1234, prefix_cache_hits=567)
    assert bench_serve.prefix_cache_counters(Metrics("m").render(snapshot)) == (1234.0, 567.0)


def test_counters_sum_vllms_labelled_samples():
    text = "\n".join([
        "# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.",
        "# TYPE vllm:prefix_cache_queries_total counter",
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0',
        'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 50.0',
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 30.0',
        'vllm:prefix_cache_hits_total{engine="1",model_name="m"} 20.0',
        "vllm:num_requests_running 2.0",
    ])
    assert bench_serve.prefix_cache_counters(text) == (150.0, 50.0)


def test_no_counters_without_both_names():
    assert bench_serve.prefix_cache_counters("v4serve_prompt_tokens_total 10\n") is None
    assert bench_serve.prefix_cache_counters("v4serve_prefix_cache_queries_total 10\n") is None


def _result(ttft_ms: float, label: str, error: str | None = None) -> bench_serve.Result:
    return bench_serve.Result(ttft_ms / 1e3, ttft_ms / 1e3 + 0.5, 11, 100, error, label)


def test_summary_groups_ttft_by_label_and_divides_hits_by_queries():
    args = bench_serve.parse_args(["--dataset-name", "multi_turn", "--num-conversations", "2", "--num-turns", "2",
                                   "--metadata", "prefix_caching=on", "run=3"])
    results = [_result(100, "turn 1"), _result(300, "turn 1"), _result(20, "turn 2"), _result(40, "turn 2"),
               _result(0, "turn 2", error="HTTP 500: boom")]
    summary = bench_serve.summarize(bench_serve.Run(results, 2.0, "m", (1000.0, 250.0)), args)
    assert summary["num_requests"] == 5 and summary["failed"] == 1
    rows = {row["label"]: row for row in summary["ttft_ms_by_label"]}
    assert list(rows) == ["turn 1", "turn 2"]
    assert rows["turn 1"]["count"] == 2 and rows["turn 1"]["ttft_ms_p50"] == pytest.approx(200)
    assert rows["turn 2"]["count"] == 2 and rows["turn 2"]["ttft_ms_mean"] == pytest.approx(30)  # failed one left out
    assert summary["prefix_cache_hit_rate"] == 0.25
    assert summary["output_tokens_per_s"] == pytest.approx(4 * 11 / 2.0)
    assert summary["metadata"] == {"prefix_caching": "on", "run": "3"}
    assert summary["workload"]["num_turns"] == 2
    json.dumps(bench_serve._finite(summary), allow_nan=False)  # request_rate inf -> null


def test_summary_has_no_hit_rate_without_counters_or_queries():
    args = bench_serve.parse_args([])
    for counters in (None, (0.0, 0.0)):
        summary = bench_serve.summarize(bench_serve.Run([_result(5, "")], 1.0, "m", counters), args)
        assert summary["prefix_cache_hit_rate"] is None and summary["ttft_ms_by_label"] == []


def test_flags_take_vllms_names_and_multi_turn_counts_its_requests():
    args = bench_serve.parse_args(["--num-prompts", "5", "--max-concurrency", "3", "--random-input-len", "7"])
    assert (args.num_requests, args.concurrency, args.prompt_len) == (5, 3, 7)
    assert bench_serve.parse_args([]).num_requests == bench_serve.DEFAULT_NUM_REQUESTS
    args = bench_serve.parse_args(["--dataset-name", "multi_turn", "--num-conversations", "3", "--num-turns", "4"])
    assert args.num_requests == 12 and len(bench_serve.build_workload(args)) == 3
    with pytest.raises(SystemExit):
        bench_serve.parse_args(["--dataset-name", "multi_turn", "--num-requests", "5"])
    with pytest.raises(SystemExit):
        bench_serve.parse_args(["--metadata", "no-equals-sign"])


def test_ready_check_gives_up_on_a_port_nobody_listens_on():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again when the block ends: connections are refused

    async def check():
        async with httpx.AsyncClient() as http:
            await bench_serve.wait_until_ready(http, f"http://127.0.0.1:{port}", timeout_s=0)

    with pytest.raises(TimeoutError, match="/health"):
        asyncio.run(check())
