"""SIGTERM drains: a stream in flight when the signal arrives completes, then the engine stops and the process exits."""

from __future__ import annotations

import json
import signal
import threading

import httpx

from server_harness import launch, tiny_server_args


def test_sigterm_drains_in_flight_requests(tmp_path):
    server = launch(tiny_server_args(), tmp_path / "server.log")
    max_tokens = 40
    result: dict = {"tokens": 0, "done": False}
    started = threading.Event()

    def stream() -> None:
        body = {"prompt": "Drain me", "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}}
        with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                started.set()
                if line == "data: [DONE]":
                    result["done"] = True
                elif line.startswith("data: {") and json.loads(line[6:]).get("usage"):
                    result["tokens"] = json.loads(line[6:])["usage"]["completion_tokens"]

    thread = threading.Thread(target=stream)
    thread.start()
    try:
        assert started.wait(60)
        # uvicorn re-raises the signal after its graceful shutdown: exit status -SIGTERM.
        assert server.stop(timeout=120) in (0, -signal.SIGTERM)
    finally:
        thread.join(120)
        server.stop()
    assert result == {"tokens": max_tokens, "done": True}, server.log()
    log = server.log()
    assert "Waiting for connections to close" in log and "Application shutdown complete" in log
