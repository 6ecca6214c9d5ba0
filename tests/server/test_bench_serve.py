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
