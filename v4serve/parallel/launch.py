"""Rank 0 starts ranks 1..N-1 and feeds them each step; the workers run the same model steps.

Rank 0 (the caller's process: `LLM`, the server) owns the engine and the scheduler. Its
`ModelRunner` starts the workers (`Workers`: spawned processes, one per rank), and before each
step sends them the step's description over one pipe per worker:

    (kind, cache_ops, payload)
    kind      "prefill": payload (chunks, token_ids, logits_rows)   -> ModelRunner.prefill
              "decode":  payload (token_ids | None, positions, slots) -> ModelRunner.decode;
                         None: the tokens are on rank 0's device (a decode continuation) and
                         follow as one broadcast over the process group (no host sync)
              "stop"
    cache_ops the page-table changes since the last step, in order: ("open", slot),
              ("reserve", slot, num_tokens), ("close", slot), and with prefix caching
              ("attach", slot, hit, num_tokens) (cached pages and their snapshot's state given to
              a new sequence), ("snapshot", ends) (page-end states kept after a prefill step),
              ("register", slot, num_computed, tokens | None) (full pages entered in the prefix tree)

A worker replays the cache ops on its own `PagedKVCache` (same allocator, prefix tree and snapshot
pool, same calls in the same order: the same pages and snapshot slots; every rank holds the whole
latent KV, so each restores and keeps its own copies of the states) and runs the step, so every
rank launches the same collectives in the same order. Only rank 0 samples (and looks prefixes
up); the workers' logits are dropped.

Failure: a worker that raises sends its traceback and exits; rank 0 checks its workers before
each step and turns a failed collective into `RankDied`, naming the rank, its exit code and its
traceback. Collectives time out (`group.py`). A worker whose rank 0 is gone (pipe closed, or its
parent changed) exits.
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback
import weakref

import torch
import torch.multiprocessing as mp

from v4serve.parallel.group import DEFAULT_TIMEOUT_S, Group, client_store, master_store

HOST = "127.0.0.1"


class RankDied(RuntimeError):
    """A tensor-parallel rank exited or failed: the engine cannot continue."""


def rank_device(device: torch.device, rank: int) -> torch.device:
    return torch.device("cuda", rank) if device.type == "cuda" else device


class Workers:
    """Rank 0's handle on ranks 1..size-1 (started here, stopped when this object goes)."""

    def __init__(self, args, device: torch.device, dtype: torch.dtype, timeout_s: float = DEFAULT_TIMEOUT_S):
        size = args.tensor_parallel_size
        if device.type == "cuda" and torch.cuda.device_count() < size:
            raise ValueError(f"tensor_parallel_size {size} needs {size} GPUs; {torch.cuda.device_count()} visible")
        store = master_store(HOST, size, timeout_s)
        ctx = mp.get_context("spawn")
        self.procs, self.pipes = [], []
        for rank in range(1, size):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=worker_main, name=f"v4serve-tp{rank}", daemon=True,
                               args=(args, rank, store.port, theirs, str(rank_device(device, rank)), dtype,
                                     timeout_s, os.getpid()))
            proc.start()
            theirs.close()
            self.procs.append(proc)
            self.pipes.append(mine)
        self._ops: list[tuple] = []
        self._stop = weakref.finalize(self, _stop_workers, self.procs, self.pipes)
        self.group = Group(store, 0, size, device, timeout_s)  # joined by `connect`, once rank 0 has built
        self._timeout_s = timeout_s

    def connect(self) -> None:
        """Wait for every worker to start, then join the process group with them."""
        self._wait_started(self._timeout_s)
        with self.guard("joining the process group"):
            self.group.connect()

    def _wait_started(self, timeout_s: float) -> None:
        """Until every worker says it is joining the group (a worker that dies before fails here at
        once, not after the group's timeout)."""
        waiting = set(range(len(self.procs)))
        deadline = time.monotonic() + timeout_s
        while waiting:
            for i in list(waiting):
                if self.pipes[i].poll(0.05):
                    try:
                        kind, text = self.pipes[i].recv()
                    except (EOFError, OSError):
                        kind = "gone"
                    if kind == "started":
                        waiting.discard(i)
                        continue
                    if kind == "error":
                        raise RankDied(f"tensor-parallel rank {i + 1} failed at start:\n{text}")
                if not self.procs[i].is_alive():
                    self.check()
            if time.monotonic() > deadline:
                raise RankDied(f"tensor-parallel ranks {sorted(w + 1 for w in waiting)} did not start in {timeout_s:.0f} s")

    def record(self, cache) -> None:
        """Log `cache`'s page-table changes (open / reserve / close) for the next step's message."""
        ops, open_sequence, reserve, close_sequence = self._ops, cache.open_sequence, cache.reserve, cache.close_sequence

        def opened() -> int:
            slot = open_sequence()
            ops.append(("open", slot))
            return slot

        def reserved(slot: int, num_tokens: int) -> None:
            reserve(slot, num_tokens)
            ops.append(("reserve", slot, num_tokens))

        def closed(slot: int) -> None:
            close_sequence(slot)
            ops.append(("close", slot))

        cache.open_sequence, cache.reserve, cache.close_sequence = opened, reserved, closed
        if cache.prefix is not None:
            self._record_prefix_caching(cache)

    def _record_prefix_caching(self, cache) -> None:
        """Log prefix caching's cache changes too (lookups change nothing: not logged)."""
        ops, attach, snapshot, register = self._ops, cache.attach_prefix, cache.snapshot_pages, cache.register_pages

        def attached(slot, hit, num_tokens) -> None:
            attach(slot, hit, num_tokens)
            ops.append(("attach", slot, hit, num_tokens))

        def snapshotted(ends) -> None:
            ends = list(ends)
            snapshot(ends)
            ops.append(("snapshot", ends))

        def registered(slot, num_computed, token_ids) -> None:
            read = []  # the tokens, if the cache asked for them (then the worker's asks too: same state)

            def tokens():
                read.append(list(token_ids()))
                return read[-1]

            register(slot, num_computed, tokens)
            ops.append(("register", slot, num_computed, read[0] if read else None))

        cache.attach_prefix, cache.snapshot_pages, cache.register_pages = attached, snapshotted, registered

    def send(self, kind: str, *payload) -> None:
        self.check()
        message = (kind, list(self._ops), payload)
        self._ops.clear()
        with self.guard(f"sending a {kind} step"):
            for pipe in self.pipes:
                pipe.send(message)

    def check(self) -> None:
        """Raise `RankDied` if a worker has exited or reported an error."""
        for rank, (proc, pipe) in enumerate(zip(self.procs, self.pipes), start=1):
            error = _reported_error(pipe)
            if error is not None or not proc.is_alive():
                if error is None:
                    proc.join(1.0)
                    error = _reported_error(pipe)
                code = proc.exitcode
                raise RankDied(f"tensor-parallel rank {rank} (pid {proc.pid}) "
                               + (f"exited with code {code}" if code is not None else "failed")
                               + (f":\n{error}" if error else "") + "; the engine stops (restart it)")

    @contextlib.contextmanager
    def guard(self, what: str):
        """Errors raised inside (a collective with a dead peer) come out as `RankDied` naming the rank."""
        try:
            yield
        except RankDied:
            raise
        except Exception as e:
            for proc in self.procs:  # a peer's death may be seen by the collective before the OS reaps it
                proc.join(0.5)
            self.check()
            raise RankDied(f"tensor-parallel step failed while {what}: {e}") from e

    def close(self) -> None:
        self._stop()


def _reported_error(pipe) -> str | None:
    try:
        while pipe.poll():
            kind, text = pipe.recv()
            if kind == "error":
                return text
    except (EOFError, OSError):
        return None
    return None


def _stop_workers(procs, pipes) -> None:
    for pipe in pipes:
        with contextlib.suppress(Exception):
            pipe.send(("stop", [], ()))
    for proc in procs:
        proc.join(10.0)
        if proc.is_alive():
            proc.kill()
            proc.join(5.0)


def worker_main(args, rank: int, port: int, conn, device: str, dtype: torch.dtype, timeout_s: float,
                parent_pid: int) -> None:
    """A worker's whole life: join the group, build this rank's runner, then run rank 0's steps."""
    from v4serve.engine.model_runner import ModelRunner

    try:
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        conn.send(("started", None))
        group = Group(client_store(HOST, port, args.tensor_parallel_size, timeout_s), rank,
                      args.tensor_parallel_size, device, timeout_s).connect()
        runner = ModelRunner(args, device, dtype, group=group)
        serve_steps(runner, conn, parent_pid)
    except BaseException:
        with contextlib.suppress(Exception):
            conn.send(("error", traceback.format_exc()))
        raise SystemExit(1)


def serve_steps(runner, conn, parent_pid: int) -> None:
    cache, group = runner.cache, runner.group
    while True:
        if not conn.poll(1.0):
            if os.getppid() != parent_pid:  # rank 0 is gone (its pipe end may outlive it in a grandchild)
                raise RankDied(f"rank {group.rank}: rank 0 (pid {parent_pid}) is gone")
            continue
        try:
            kind, ops, payload = conn.recv()
        except EOFError:
            return  # rank 0 closed its end: it has stopped
        for op in ops:
            if op[0] == "open":
                slot = cache.open_sequence()
                if slot != op[1]:
                    raise RankDied(f"rank {group.rank}: cache slots diverged from rank 0 ({slot} != {op[1]})")
            elif op[0] == "reserve":
                cache.reserve(op[1], op[2])
            elif op[0] == "close":
                cache.close_sequence(op[1])
            elif op[0] == "attach":
                cache.attach_prefix(op[1], op[2], op[3])
            elif op[0] == "snapshot":
                cache.snapshot_pages(op[1])
            elif op[0] == "register":
                tokens = op[3]
                cache.register_pages(op[1], op[2], lambda: tokens)
            else:
                raise RankDied(f"rank {group.rank}: unknown cache op {op[0]!r}")
        if kind == "stop":
            return
        if kind == "prefill":
            runner.prefill(*payload)
        elif kind == "decode":
            token_ids, positions, slots = payload
            if token_ids is None:
                token_ids = group.broadcast(torch.empty(len(positions), dtype=torch.int64, device=runner.device))
            runner.decode(token_ids, positions, slots)
        else:
            raise RankDied(f"rank {group.rank}: unknown step kind {kind!r}")
