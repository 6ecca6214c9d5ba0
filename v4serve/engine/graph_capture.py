"""CUDA-graph capture shared by the runners that replay steps (`decode_runner.py`,
`verify_runner.py`): one graph set per batch size of a ladder, captured largest first into one
memory pool, and, where an op cannot be captured, no graphs at all (the runner then runs its steps
eagerly: correct, only slower).

Each capture follows the same two calls: the step once eagerly (Triton compiles its kernels, the
caching allocator settles; the step's rows sit on the cache's padding slot, so nothing live is
written), a device synchronisation, then the same step recorded into a graph. A capture runs
nothing: the tensors it returns are the graph's static outputs, filled by each replay.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, TypeVar

import torch

logger = logging.getLogger(__name__)

Captured = TypeVar("Captured")


def capture_graph(step: Callable[[], Any], pool) -> tuple[torch.cuda.CUDAGraph, Any]:
    """(graph, step's outputs): `step` warmed up once eagerly, then captured into `pool`."""
    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = step()
    return graph, outputs


def capture_ladder(sizes: list[int], capture_size: Callable[[int, Any], Captured], what: str) -> dict[int, Captured]:
    """{size: capture_size(size, pool)} for every size, largest first (smaller graphs reuse its
    memory in the shared pool), under inference mode; {} with a warning naming `what` when any
    capture raises (an op that cannot be captured)."""
    graphs: dict[int, Captured] = {}
    try:
        with torch.inference_mode():
            pool = torch.cuda.graph_pool_handle()
            for size in sorted(sizes, reverse=True):
                graphs[size] = capture_size(size, pool)
    except RuntimeError as e:
        logger.warning("CUDA-graph capture of %s failed, running them eagerly: %s", what, e)
        return {}
    return graphs
