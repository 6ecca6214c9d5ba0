"""The command line, run as users run it (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "v4serve.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=300)


def test_generate_prints_the_greedy_continuation():
    from v4serve import LLM, SamplingParams

    done = _cli("generate", "--model", "tiny", "--device", "cpu", "--max-tokens", "6", "The capital of France is")
    assert done.returncode == 0, done.stderr
    expected = LLM("tiny", device="cpu", progress=False).generate(
        ["The capital of France is"], SamplingParams(temperature=0.0, max_tokens=6))[0].outputs[0].text
    assert done.stdout == expected + "\n"


def test_bad_input_exits_2_with_a_clear_message():
    unknown = _cli("generate", "--model", "no-such-model", "hi")
    assert unknown.returncode == 2 and "neither a preset" in unknown.stderr
    empty = _cli("generate", "--model", "tiny", "--device", "cpu", "")
    assert empty.returncode == 2 and "empty" in empty.stderr
    zero = _cli("generate", "--model", "tiny", "--device", "cpu", "--max-tokens", "0", "hi")
    assert zero.returncode == 2 and "max_tokens" in zero.stderr
