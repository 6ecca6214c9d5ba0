"""`v4serve bench serve` against the test server: a table, then one JSON line with the figures."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_serve_reports_throughput_and_percentiles(server):
    cmd = [sys.executable, "-m", "v4serve.cli", "bench", "serve", "--url", server.url, "--num-requests", "6",
           "--concurrency", "3", "--prompt-len", "20", "--output-len", "4"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["failed"] == 0 and summary["num_requests"] == 6 and summary["model"] == "tiny"
    assert summary["output_tokens_per_s"] > 0
    assert 0 < summary["ttft_ms_p50"] <= summary["ttft_ms_p99"] <= summary["latency_ms_p99"]
    assert summary["tpot_ms_p50"] > 0
    assert any(line.startswith("ttft_ms") for line in lines)


def test_bench_serve_reads_the_servers_prefix_cache_hits(server, capsys):
    """prefix_repetition, one 512-token prefix, one request at a time: the first prompt is computed
    whole, the next two find the prefix cached. The session server's step budget is 512 tokens, so
    the chunk grid is 512: a 528-token prompt keeps a snapshot at 512, where the next hit ends
    (docs/prefix-caching.md). The warm-up request shares nothing and is not counted."""
    from v4serve.bench import serve as bench_serve

    args = ["--url", server.url, "--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "512",
            "--prefix-repetition-suffix-len", "16", "--num-prompts", "3", "--max-concurrency", "1",
            "--output-len", "2", "--num-warmups", "1", "--ready-check-timeout-sec", "10", "--seed", "7"]
    assert bench_serve.main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["failed"] == 0 and summary["num_requests"] == 3
    assert summary["prefix_cache_queries"] == 3 * 528
    assert summary["prefix_cache_hits"] == 2 * 512
    assert summary["prefix_cache_hit_rate"] == 1024 / 1584
    assert [(row["label"], row["count"]) for row in summary["ttft_ms_by_label"]] == [("new prefix", 1),
                                                                                    ("repeated prefix", 2)]
