"""A dead tensor-parallel rank stops the server: the engine loop fails the requests in flight with
the `RankDied` error, calls its `on_fatal` (serve.py stops uvicorn and exits 1), reports itself
stopped and refuses new requests. The rank's death is stood in by the engine's step raising."""

from __future__ import annotations

import threading

import pytest

from v4serve.engine import Engine, SamplingParams
from v4serve.engine.args import EngineArgs
from v4serve.parallel.launch import RankDied
from v4serve.server.engine_loop import EngineLoop
from v4serve.server.metrics import Metrics


def test_rank_died_stops_the_engine_loop():
    engine = Engine(EngineArgs("tiny", device="cpu", hf_overrides={"num_hidden_layers": 1}, max_model_len=64,
                               progress=False))

    def dead_step():
        raise RankDied("tensor-parallel rank 1 (pid 4242) exited with code -9; the engine stops (restart it)")

    engine.step = dead_step
    loop = EngineLoop(engine, Metrics("tiny"))
    fatal, got, done = [], [], threading.Event()
    loop.on_fatal = fatal.append
    loop.start()
    try:
        loop.submit("r0", [5] * 8, SamplingParams(max_tokens=4), lambda out: (got.append(out), done.set()))
        assert done.wait(30)
        assert isinstance(got[0], RankDied) and "rank 1 (pid 4242)" in str(got[0])
        loop._thread.join(10)
        assert fatal and fatal[0] is got[0]
        assert not loop.snapshot.alive
        with pytest.raises(RuntimeError, match="shutting down"):
            loop.submit("r1", [5] * 8, SamplingParams(max_tokens=4), lambda out: None)
    finally:
        loop.stop()
