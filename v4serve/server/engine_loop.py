"""The one thread that owns the engine.

Request handlers never touch the engine: they call `submit` and `abort`, which queue commands
under a lock and wake the thread. The thread runs queued commands, steps the engine while any
request is unfinished, and sleeps on a condition otherwise. Each step's outputs go to the sink
that `submit` registered for the request (the sink is called on the engine thread; the server's
sinks hand the output to the asyncio loop with `call_soon_threadsafe`). After every round the
thread publishes an `EngineSnapshot` that `/metrics` and `/health` read without locking.

`num_queued()` counts the engine requests not yet running: those submitted whose command has
not run, plus the scheduler's waiting queue as the engine thread last saw it (kept under the
lock, updated as each request is added and after each step, so the sum never dips in between).
The server refuses new requests while it is at `--max-queued-requests` (serving.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from v4serve.engine import Engine, RequestOutput, SamplingParams
from v4serve.parallel.launch import RankDied
from v4serve.server.metrics import Metrics

log = logging.getLogger("v4serve.server")

# A sink receives each RequestOutput of its request, or an Exception (the request failed).
Sink = Callable[[RequestOutput | Exception], None]


@dataclass(frozen=True)
class EngineSnapshot:
    running: int
    waiting: int
    pages_used: int
    pages_total: int
    preemptions: int  # since start
    alive: bool
    kv_bytes_total: int = 0  # bytes the KV cache allocated (packed rows count their packed bytes)
    kv_bytes_per_page: int = 0  # bytes of the paged tiers per page
    prefix_cache_queries: int = 0  # prompt tokens looked up in the prefix cache, since start
    prefix_cache_hits: int = 0  # of which found cached
    spec_decode: Any = None  # a copy of the engine's SpecDecodeMetrics when speculating (engine/spec_metrics.py)


@dataclass
class _Tracked:
    sink: Sink
    num_prompt_tokens: int
    submitted: float
    last_token: float | None = None  # time of the latest token
    num_tokens: int = 0


class EngineLoop:
    def __init__(self, engine: Engine, metrics: Metrics):
        self._engine = engine
        self._metrics = metrics
        self._cond = threading.Condition()
        self._commands: list[Callable[[], None]] = []
        self._tracked: dict[str, _Tracked] = {}
        self._stopping = False
        self.on_fatal: Callable[[BaseException], None] | None = None  # the server stops itself (`serve.py`)
        self._pending = 0  # submitted, not yet added to the engine (under _cond)
        self._waiting = 0  # the scheduler's waiting queue, as last seen by the engine thread (under _cond)
        self._thread = threading.Thread(target=self._run, name="v4serve-engine", daemon=True)
        self.snapshot = self._snapshot(alive=False)

    # ------------------------------------------------------------------ any thread
    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Fail what is left (the server drains before calling this) and end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, sink: Sink,
               group: str | None = None) -> None:
        """Queue a request; `group` names the API request it belongs to (Scheduler fairness)."""
        submitted = time.monotonic()

        def add() -> None:
            try:
                self._engine.add_request(request_id, prompt_token_ids, params, group=group)
            except Exception as e:  # ValueError: bad request; anything else: a bug, this request only
                sink(e)
                return
            finally:
                with self._cond:
                    self._pending -= 1
                    self._waiting = len(self._engine.scheduler.waiting)
            self._tracked[request_id] = _Tracked(sink, len(prompt_token_ids), submitted)

        self._queue(add, pending=1)

    def num_queued(self) -> int:
        """Engine requests submitted and not yet running (see the module docstring)."""
        with self._cond:
            return self._pending + self._waiting

    def abort(self, request_id: str) -> None:
        """Stop a request and free its pages at once (no-op if it already finished)."""

        def cancel() -> None:
            if self._tracked.pop(request_id, None) is not None:
                self._engine.abort(request_id)
                self._metrics.finished("abort")

        self._queue(cancel)

    def _queue(self, command: Callable[[], None], pending: int = 0) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("the engine is shutting down")
            self._pending += pending
            self._commands.append(command)
            self._cond.notify()

    # ------------------------------------------------------------------ engine thread
    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self.snapshot = self._snapshot(alive=False)

    def _serve(self) -> None:
        self.snapshot = self._snapshot(alive=True)
        while True:
            with self._cond:
                while not (self._commands or self._stopping or self._engine.has_unfinished()):
                    self._cond.wait()
                commands, self._commands = self._commands, []
                stopping = self._stopping
            for command in commands:
                command()
            if stopping:
                self._fail_all(RuntimeError("the server shut down before the request finished"))
                return
            if self._engine.has_unfinished():
                self._step()
            with self._cond:
                self._waiting = len(self._engine.scheduler.waiting)
            self.snapshot = self._snapshot(alive=True)

    def _step(self) -> None:
        try:
            outputs = self._engine.step()
        except RankDied as e:  # a tensor-parallel rank is gone: nothing can run any more; stop serving
            log.critical("%s", e)
            self._fail_all(e)
            with self._cond:
                self._stopping = True
            if self.on_fatal is not None:
                self.on_fatal(e)
            return
        except Exception as e:  # a bug: fail the requests in flight, keep serving
            log.exception("engine step failed; failing %d requests", len(self._tracked))
            self._fail_all(e)
            return
        now = time.monotonic()
        for out in outputs:
            tracked = self._tracked.get(out.request_id)
            if tracked is None:
                continue
            self._account(tracked, out, now)
            if out.finished:
                del self._tracked[out.request_id]
                self._metrics.finished(out.outputs[0].finish_reason or "stop")
            tracked.sink(out)

    def _account(self, tracked: _Tracked, out: RequestOutput, now: float) -> None:
        new = len(out.outputs[0].token_ids) - tracked.num_tokens
        if new <= 0:
            return
        if tracked.last_token is None:
            self._metrics.prompt_tokens(tracked.num_prompt_tokens)
            self._metrics.ttft(now - tracked.submitted)
        else:
            self._metrics.tpot((now - tracked.last_token) / new)
        self._metrics.generation_tokens(new)
        tracked.num_tokens += new
        tracked.last_token = now

    def _fail_all(self, error: Exception) -> None:
        for request_id, tracked in list(self._tracked.items()):
            self._engine.abort(request_id)
            tracked.sink(error)
        self._tracked.clear()

    def _snapshot(self, alive: bool) -> EngineSnapshot:
        scheduler, allocator = self._engine.scheduler, self._engine.cache.allocator
        budget, prefix = self._engine.kv_budget, self._engine.cache.prefix
        spec = getattr(self._engine, "spec", None)
        return EngineSnapshot(len(scheduler.running), len(scheduler.waiting), allocator.num_used,
                              allocator.num_pages, scheduler.num_preemptions, alive, budget.total_bytes,
                              int(budget.bytes_per_token * budget.page_size),
                              prefix.queries if prefix is not None else 0, prefix.hits if prefix is not None else 0,
                              None if spec is None else spec.metrics.copy())
