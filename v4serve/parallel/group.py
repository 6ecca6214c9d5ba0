"""A tensor-parallel process group without torch.distributed's global default group.

Every collective the sharded model runs goes through one `Group` object that the sharding
transformation binds into the modules (`shard.py`): gloo on the CPU, NCCL on CUDA, built straight
on a TCPStore so that two engines in one process (a test's 1-process reference beside a TP engine)
never share state. Every collective waits at most `timeout` (a peer that died makes it raise, never
hang); gloo also raises at once when a peer's connection closes.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 60.0


class CollectiveError(RuntimeError):
    """A collective failed: a rank died, timed out or raised."""


class Group:
    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.rank, self.size, self.device = rank, size, device
        self.timeout = timedelta(seconds=timeout_s)
        self.store = store
        self._pg = None

    def connect(self) -> "Group":
        """Join the other ranks (blocks until all have; at most the timeout). The model can be cut
        before (only `rank` and `size` are needed), so rank 0 builds while its workers start."""
        if self._pg is None:
            if self.device.type == "cuda":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = self.timeout
                self._pg = dist.ProcessGroupNCCL(self.store, self.rank, self.size, options)
            else:
                self._pg = dist.ProcessGroupGloo(self.store, self.rank, self.size, self.timeout)
        return self

    @property
    def pg(self):
        return self.connect()._pg

    def _wait(self, work, what: str) -> None:
        try:  # NCCL: the stream waits, not the host (capturable); its watchdog enforces the timeout
            work.wait() if self.device.type == "cuda" else work.wait(self.timeout)
        except Exception as e:  # gloo / NCCL raise RuntimeError subclasses with their own wording
            raise CollectiveError(f"tensor-parallel rank {self.rank}/{self.size}: {what} failed "
                                  f"(a peer rank died or timed out after {self.timeout.total_seconds():.0f} s): {e}") from e

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum over ranks, in place; returns `t`. (The summation order differs from one process's
        single GEMM: float results agree to rounding, not bit for bit.)"""
        self._wait(self.pg.allreduce([t]), "all-reduce")
        return t

    def all_reduce_min(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self._wait(self.pg.allreduce([t], opts), "all-reduce (min)")
        return int(t.item())

    def all_gather(self, t: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `t` concatenated along `dim` in rank order."""
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.size)]
        self._wait(self.pg.allgather([parts], [t]), "all-gather")
        return torch.cat(parts, dim=dim)

    def broadcast(self, t: torch.Tensor, root: int = 0) -> torch.Tensor:
        """`t` from rank `root` into every rank's `t` (same shape and dtype), in place."""
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self._wait(self.pg.broadcast([t], opts), "broadcast")
        return t


def client_store(host: str, port: int, size: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> dist.TCPStore:
    return dist.TCPStore(host, port, size, is_master=False, timeout=timedelta(seconds=timeout_s))


def master_store(host: str = "127.0.0.1", size: int = 1, timeout_s: float = DEFAULT_TIMEOUT_S) -> dist.TCPStore:
    """The store every rank's `Group` joins; port 0 picks a free port (`store.port`)."""
    return dist.TCPStore(host, 0, size, is_master=True, timeout=timedelta(seconds=timeout_s),
                         wait_for_workers=False)
