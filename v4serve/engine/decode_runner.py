"""Decode steps (one token per sequence): addressed on the device and, on CUDA, replayed as
captured CUDA graphs.

Graphs are captured once per batch size of a ladder (by default 1, 2, 4, 8, ... up to
`max_num_seqs`; `EngineArgs.cuda_graph_sizes` picks others); a step of n sequences replays the
smallest graph with room for n, its extra rows pointed at the cache's padding slot and routed in
the MoE as live rows (`padded_route_rows`), and runs eagerly when no graph has room.

Measured on the H200 (docs/performance.md): once a process has captured four or more CUDA graphs,
every graph replays its kernels with ~0.3 µs more between them (0.49 vs 0.18 µs per kernel, ~5%
of a c=1 step), even after the extra graphs are destroyed; three graphs or fewer do not. Fewer
sizes trade that for padding at the sizes in between (~8 µs per padding row).

A step's inputs are four small host-to-device copies into the graph's static buffers (tokens,
positions, slots, route rows); everything else (window and compressed addressing, compressor
state, indexer top-k, MoE grouping) is computed on the device inside the graph, with no host
synchronisation.
"""

from __future__ import annotations

import torch

from v4serve.cache import PagedKVCache
from v4serve.engine.graph_capture import capture_graph, capture_ladder
from v4serve.model.deepseek_v4 import DeepseekV4ForCausalLM


def batch_size_ladder(max_batch: int, sizes: tuple[int, ...] | None = None) -> list[int]:
    """The batch sizes to capture: `sizes` (sorted, each in [1, max_batch]) or powers of two up to
    max_batch, plus max_batch."""
    if sizes is not None:
        bad = [s for s in sizes if not isinstance(s, int) or not 1 <= s <= max_batch]
        if bad or not sizes:
            raise ValueError(f"cuda_graph_sizes must be integers in [1, max_num_seqs={max_batch}], got {list(sizes)}")
        return sorted(set(sizes))
    ladder, size = [], 1
    while size < max_batch:
        ladder.append(size)
        size *= 2
    return ladder + [max_batch]


def padded_route_rows(n: int, size: int) -> list[int]:
    """The MoE routing row of each of `size` rows when the first `n` are live: live rows route as
    themselves, padding rows as live rows in turn. Routed as themselves, the identical padding rows
    would pick up to top-k experts no live row uses, and the step would stream their weights too."""
    return list(range(n)) + [i % n for i in range(n, size)]


class DecodeRunner:
    def __init__(self, model: DeepseekV4ForCausalLM, cache: PagedKVCache, max_batch: int,
                 use_cuda_graphs: bool, graph_sizes: tuple[int, ...] | None = None):
        self.model = model
        self.cache = cache
        self.max_batch = max_batch
        self.ladder = batch_size_ladder(max_batch, graph_sizes)
        device = cache.device
        self._tokens = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self._positions = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self._slots = torch.full((max_batch,), cache.padding_slot, dtype=torch.int64, device=device)
        self._route_rows = torch.arange(max_batch, dtype=torch.int64, device=device)
        # Host staging of a step's [tokens | positions | slots | route rows], pinned so the copies are
        # truly asynchronous, and doubled: a step is written while the previous one may still be copying.
        pinned = device.type == "cuda"
        self._staging = [torch.zeros(4, max_batch, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self._step = 0
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = (
            capture_ladder(self.ladder, self._capture_size, "decode steps") if use_cuda_graphs else {})

    @property
    def uses_cuda_graphs(self) -> bool:
        return bool(self._graphs)

    def _forward(self, n: int) -> torch.Tensor:
        batch = self.cache.build_decode_batch(self._tokens[:n], self._positions[:n], self._slots[:n],
                                              route_rows=self._route_rows[:n] if n > 1 else None)
        return self.model(batch, self.cache)

    def _capture_size(self, n: int, pool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        return capture_graph(lambda: self._forward(n), pool)

    @torch.inference_mode()
    def run(self, token_ids: list[int] | torch.Tensor, positions: list[int], slots: list[int]) -> torch.Tensor:
        """Logits [n, vocab] for one token per sequence. `token_ids` may already be on the device (the
        tokens the previous step sampled): then no host value is needed to launch this step."""
        n = len(positions)
        if n > self.max_batch:
            raise ValueError(f"decode batch of {n} exceeds the runner's maximum of {self.max_batch}")
        size = next((s for s in self.ladder if s >= n and s in self._graphs), n)
        graphed = size in self._graphs
        pad = size - n
        staging = self._staging[self._step % 2]
        self._step += 1
        staging[1, :size] = torch.tensor(positions + [0] * pad)
        staging[2, :size] = torch.tensor(slots + [self.cache.padding_slot] * pad)
        if isinstance(token_ids, torch.Tensor):
            self._tokens[:n].copy_(token_ids)
            self._tokens[n:size].zero_()
        else:
            staging[0, :size] = torch.tensor(token_ids + [0] * pad)
            self._tokens[:size].copy_(staging[0, :size], non_blocking=True)
        self._positions[:size].copy_(staging[1, :size], non_blocking=True)
        self._slots[:size].copy_(staging[2, :size], non_blocking=True)
        if size > 1:  # a one-row step is never padded: `_forward` routes it as itself
            staging[3, :size] = torch.tensor(padded_route_rows(n, size))
            self._route_rows[:size].copy_(staging[3, :size], non_blocking=True)
        if not graphed:
            return self._forward(size)
        graph, logits = self._graphs[size]
        graph.replay()
        return logits[:n]
