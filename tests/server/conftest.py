"""Session fixtures, shared by the tests: `server` runs `v4serve serve --model tiny --device cpu`;
`scripted_server` the same server with the scripted model of `scripted_server.py` (tool-call and
format tests). Both run single-threaded; helpers in server_harness.py."""

from __future__ import annotations

import json
import sys

import pytest

from server_harness import HERE, SCRIPT, SERVER_MAX_SEQS_PER_REQUEST, ServerProcess, launch, tiny_server_args


@pytest.fixture(scope="session")
def server(tmp_path_factory) -> ServerProcess:
    s = launch(tiny_server_args("--max-seqs-per-request", str(SERVER_MAX_SEQS_PER_REQUEST)),
               tmp_path_factory.mktemp("server") / "server.log")
    yield s
    s.stop()


@pytest.fixture(scope="session")
def scripted_server(tmp_path_factory) -> ServerProcess:
    args = [sys.executable, str(HERE / "scripted_server.py"), "--model", "tiny", "--served-model-name", "scripted",
            "--hf-overrides", json.dumps({"num_hidden_layers": 1}), "--script", json.dumps(SCRIPT)]
    s = launch(args, tmp_path_factory.mktemp("scripted") / "server.log")
    yield s
    s.stop()
