"""Prometheus metrics: token counters and latency histograms (written by the engine thread) plus
gauges read from the engine snapshot at scrape time, rendered in the text exposition format."""

from __future__ import annotations

import threading
from collections import Counter

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1
        self.count += 1
        self.sum += value

    def render(self, name: str) -> list[str]:
        lines = [f'{name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.buckets, self.counts)]
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        return lines + [f"{name}_sum {self.sum}", f"{name}_count {self.count}"]


class Metrics:
    """Thread-safe: the engine thread records, handlers render."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self._lock = threading.Lock()
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._finished: Counter[str] = Counter()
        self._ttft = Histogram(TTFT_BUCKETS)
        self._tpot = Histogram(TPOT_BUCKETS)

    def prompt_tokens(self, n: int) -> None:
        with self._lock:
            self._prompt_tokens += n

    def generation_tokens(self, n: int) -> None:
        with self._lock:
            self._generation_tokens += n

    def ttft(self, seconds: float) -> None:
        with self._lock:
            self._ttft.observe(seconds)

    def tpot(self, seconds: float) -> None:
        with self._lock:
            self._tpot.observe(seconds)

    def finished(self, reason: str) -> None:
        with self._lock:
            self._finished[reason] += 1

    def render(self, snapshot) -> str:
        """The exposition text; `snapshot` is the engine loop's latest `EngineSnapshot`."""
        gauges = [
            ("v4serve_num_requests_running", "Requests in the running batch.", snapshot.running),
            ("v4serve_num_requests_waiting", "Requests waiting for a slot or pages.", snapshot.waiting),
            ("v4serve_kv_pages_used", "KV cache pages in use.", snapshot.pages_used),
            ("v4serve_kv_pages_total", "KV cache pages in all.", snapshot.pages_total),
            ("v4serve_kv_cache_bytes", "Bytes the KV cache allocated (every tier; packed rows at their packed size).",
             snapshot.kv_bytes_total),
            ("v4serve_kv_cache_used_bytes", "Bytes of the paged KV tiers in use.",
             snapshot.pages_used * snapshot.kv_bytes_per_page),
        ]
        lines = []
        for name, help_text, value in gauges:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value}"]
        with self._lock:
            counters = [
                ("v4serve_prompt_tokens_total", "Prompt tokens processed.", self._prompt_tokens),
                ("v4serve_generation_tokens_total", "Tokens generated.", self._generation_tokens),
                ("v4serve_num_preemptions_total", "Requests preempted for KV pages (recomputed later).",
                 snapshot.preemptions),
                ("v4serve_prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
                 snapshot.prefix_cache_queries),
                ("v4serve_prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
                 snapshot.prefix_cache_hits),
            ]
            for name, help_text, value in counters:
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter", f"{name} {value}"]
            name = "v4serve_request_success_total"
            lines += [f"# HELP {name} Requests finished, by finish reason.", f"# TYPE {name} counter"]
            lines += [f'{name}{{finished_reason="{r}"}} {c}' for r, c in sorted(self._finished.items())]
            for name, help_text, hist in (
                ("v4serve_time_to_first_token_seconds", "Time from arrival to the first token.", self._ttft),
                ("v4serve_time_per_output_token_seconds", "Time between consecutive tokens.", self._tpot),
            ):
                lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram", *hist.render(name)]
        return "\n".join(lines) + "\n"
