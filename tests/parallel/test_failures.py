"""A rank that dies stops the engine with an error naming it, never a hang (a killed worker:
test_tensor_parallel.kill_a_worker): a collective whose peer is gone raises within the group's timeout;
a worker whose rank 0 is gone exits by itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.multiprocessing as mp

from v4serve.parallel.group import CollectiveError, Group, client_store, master_store

ONE_LAYER = dict(device="cpu", dtype="float32", hf_overrides={"num_hidden_layers": 1}, max_model_len=64,
                 progress=False, tensor_parallel_size=2)


def _join_and_leave(port: int) -> None:
    Group(client_store("127.0.0.1", port, 2, 30.0), 1, 2, torch.device("cpu"), 30.0).connect()
    os._exit(0)  # gone without a word, as a crashed rank is


def test_a_collective_with_a_dead_peer_raises_before_its_timeout():
    store = master_store("127.0.0.1", 2, 30.0)
    peer = mp.get_context("spawn").Process(target=_join_and_leave, args=(store.port,), daemon=True)
    peer.start()
    group = Group(store, 0, 2, torch.device("cpu"), timeout_s=20.0).connect()
    peer.join(30)
    start = time.monotonic()
    with pytest.raises(CollectiveError, match=r"rank 0/2: all-reduce failed \(a peer rank died"):
        group.all_reduce(torch.ones(4))
    assert time.monotonic() - start < 21


def _running(pid: int) -> bool:
    """Alive and not a zombie (an orphan's exit may wait for a reaper that never comes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_workers_exit_when_rank_0_is_killed(tmp_path):
    script = textwrap.dedent(f"""
        import sys, time
        from v4serve import LLM
        if __name__ == "__main__":
            llm = LLM("tiny", **{ONE_LAYER!r})
            print(llm.engine.runner.workers.procs[0].pid, flush=True)
            time.sleep(600)
    """)
    (tmp_path / "rank0.py").write_text(script)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "rank0.py")], stdout=subprocess.PIPE, text=True,
                            cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        worker_pid = int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _running(worker_pid):
            return
        time.sleep(0.2)
    os.kill(worker_pid, signal.SIGKILL)
    pytest.fail(f"worker {worker_pid} still running 10 s after its rank 0 was killed")
