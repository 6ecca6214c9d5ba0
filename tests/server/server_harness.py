"""Starting real server processes for the server tests (free ports, logs, clean stops), and the
scripted completions the tool-call tests expect. The session fixtures are in conftest.py.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

HERE = Path(__file__).parent
STARTUP_TIMEOUT_S = 120
SERVER_MAX_SEQS_PER_REQUEST = 1000  # the session server's --max-seqs-per-request (the starvation test)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of /metrics."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        return {m[1]: float(m[2]) for m in re.finditer(r"^([a-z0-9_]+) ([0-9.e+-]+)$", text, re.M)}

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


def launch(args: list[str], log_path: Path) -> ServerProcess:
    """Start a server and wait until /health answers (fails with the log if it does not)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["OMP_NUM_THREADS"] = "1"
    log = open(log_path, "w")
    proc = subprocess.Popen([*args, "--host", "127.0.0.1", "--port", str(port), "--device", "cpu"],
                            stdout=log, stderr=subprocess.STDOUT, env=env)
    server = ServerProcess(proc, port, log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"server exited with {proc.returncode}:\n{server.log()}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    server.stop()
    pytest.fail(f"server did not become healthy in {STARTUP_TIMEOUT_S}s:\n{server.log()}")


def tiny_server_args(*extra: str) -> list[str]:
    return [sys.executable, "-m", "v4serve.cli", "serve", "--model", "tiny", "--max-num-seqs", "8", *extra]


# Scripted replies of the scripted server, keyed by a word of the last user turn.
WEATHER_CALL = (
    "Let me check.\n\n<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
    '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)
BROKEN_CALL = (
    "Calling.\n\n<｜DSML｜tool_calls>\n"
    '<｜DSML｜invoke name="get_weather">\n'
    '<｜DSML｜parameter name="days" string="false">three</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"
)
SCRIPT = [
    ["tool_result", "It is sunny in Paris for the next 3 days."],
    ["weather", WEATHER_CALL],
    ["broken", BROKEN_CALL],
    ["ponder", "The user wants a number.</think>42"],
    ["", "Hello from the script."],
]
