"""The command line, run as users run it (a subprocess)."""

from __future__ import annotations

import os
import re
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


def test_bad_input_exits_2_with_a_clear_message(capsys):
    """One case as a user runs it (the exit status of `python -m v4serve.cli`), the others through
    `main` in this process: the same code path without another interpreter start and model build."""
    from v4serve.cli import main

    unknown = _cli("generate", "--model", "no-such-model", "hi")
    assert unknown.returncode == 2 and "neither a preset" in unknown.stderr
    capsys.readouterr()
    assert main(["generate", "--model", "tiny", "--device", "cpu", ""]) == 2
    assert "empty" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny", "--device", "cpu", "--max-tokens", "0", "hi"]) == 2
    assert "max_tokens" in capsys.readouterr().err


def _help(main, *argv: str) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 0
    return out.getvalue()


def _options_without_default(text: str) -> list[str]:
    """Option entries of a --help text whose help does not state a default."""
    entries = re.split(r"\n(?=  -)", text.split("options:", 1)[1])
    return [e.split()[0] for e in entries if e.strip().startswith("-") and "(default:" not in e
            and not e.strip().startswith("-h, --help")]


@pytest.mark.parametrize("command", [
    ["generate", "--help"], ["serve", "--help"], ["bench", "engine", "--help"], ["bench", "serve", "--help"],
    ["bench", "kernels", "--help"], ["kernels", "report", "--help"],
])
def test_every_help_shows_defaults(command):
    from v4serve.cli import main

    text = _help(main, *command)
    assert text.count("(default:") >= 3
    assert _options_without_default(text) == []


def test_generate_and_serve_take_every_engine_arg():
    """Both commands expose every EngineArgs field as a flag, and the flags reach EngineArgs."""
    import argparse
    import dataclasses

    from v4serve.engine import EngineArgs
    from v4serve.engine_flags import NOT_FLAGS, add_engine_args, engine_kwargs
    from v4serve.server.serve import add_serve_args, engine_args

    fields = {f.name for f in dataclasses.fields(EngineArgs)} - NOT_FLAGS
    gen, srv = argparse.ArgumentParser(), argparse.ArgumentParser()
    add_engine_args(gen)
    add_serve_args(srv)
    for parser in (gen, srv):
        assert fields <= {a.dest for a in parser._actions}
    argv = ["--kernels", "torch", "--seed", "7", "--no-overlap-decode", "--cuda-graph-sizes", "1", "4",
            "--kv-cache-memory", "1GiB", "--hf-overrides", '{"num_hidden_layers": 2}', "--enforce-eager",
            "--gpu-memory-utilization", "0.9", "--trust-remote-code"]
    served = engine_args(srv.parse_args(argv))
    generated = EngineArgs(**engine_kwargs(gen.parse_args(argv)))
    for args in (served, generated):
        assert (args.kernels, args.seed, args.overlap_decode, args.cuda_graph_sizes) == ("torch", 7, False, (1, 4))
        assert args.kv_cache_memory == 2**30 and args.hf_overrides == {"num_hidden_layers": 2}
        assert args.enforce_eager is True and args.gpu_memory_utilization == 0.9
    defaults = EngineArgs(**engine_kwargs(gen.parse_args([])))
    reference = EngineArgs(model="tiny")
    assert all(getattr(defaults, f) == getattr(reference, f) for f in fields)
    assert engine_args(srv.parse_args([])).progress is False


def test_serve_without_its_packages_says_what_to_install():
    code = "import sys; sys.modules['fastapi'] = None; from v4serve.cli import main; sys.exit(main(['serve']))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "fastapi" in done.stderr and "pip install" in done.stderr


def test_kernels_report_prints_progress_as_it_goes(monkeypatch):
    """Each (kernel, arch) is reported when it ends, not after the last one."""
    import time
    import types

    from v4serve.codegen import report

    def fake_run_one(spec, arch):
        time.sleep(0.6 if spec.name == "slow" else 0.0)
        return {"kernel": spec.name, "arch": arch, "status": "ok", "ended": time.monotonic()}

    def Spec(name):  # picklable, for the worker processes
        return types.SimpleNamespace(name=name, archs=None)

    monkeypatch.setattr(report, "run_one", fake_run_one)
    heard = []
    for jobs in (1, 2):
        heard.clear()
        rows = report.collect([Spec("slow"), Spec("fast")], [90], jobs,
                              lambda row, done, total: heard.append((row["kernel"], done, total, time.monotonic())))
        assert [r["kernel"] for r in rows] == ["slow", "fast"]  # report order, whatever the finishing order
        assert [(k, d, t) for k, d, t, _ in heard] == ([("slow", 1, 2), ("fast", 2, 2)] if jobs == 1
                                                       else [("fast", 1, 2), ("slow", 2, 2)])
        first_heard = heard[0][3]
        assert first_heard < max(r["ended"] for r in rows), "progress came only after the last kernel"
