"""The command line, run as users run it (a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "v4serve.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=300)


PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def tiny_continuation() -> str:
    from v4serve import LLM, SamplingParams

    return LLM("tiny", device="cpu", progress=False).generate(
        [PROMPT], SamplingParams(temperature=0.0, max_tokens=6))[0].outputs[0].text


def test_generate_prints_the_greedy_continuation(tiny_continuation):
    done = _cli("generate", "--model", "tiny", "--device", "cpu", "--max-tokens", "6", PROMPT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == tiny_continuation + "\n"


def test_generate_from_a_checkpoint_folder(tiny_continuation, tmp_path):
    """The tiny preset saved as a checkpoint (no tokenizer.json: the bundled one) continues alike."""
    import torch

    from v4serve.model.loader import build_model, save_pretrained

    save_pretrained(*build_model("tiny", "cpu", torch.float32, progress=False), tmp_path)
    done = _cli("generate", "--model", str(tmp_path), "--device", "cpu", "--max-tokens", "6", PROMPT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == tiny_continuation + "\n"


def test_bad_input_exits_2_with_a_clear_message():
    unknown = _cli("generate", "--model", "no-such-model", "hi")
    assert unknown.returncode == 2 and "neither a preset" in unknown.stderr
    empty = _cli("generate", "--model", "tiny", "--device", "cpu", "")
    assert empty.returncode == 2 and "empty" in empty.stderr
    zero = _cli("generate", "--model", "tiny", "--device", "cpu", "--max-tokens", "0", "hi")
    assert zero.returncode == 2 and "max_tokens" in zero.stderr
