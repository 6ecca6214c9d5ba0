"""MoE pick sort (picks grouped by expert, group ends, inverse order): public entry point (math in
moe_sort_reference.py, kernel in moe_sort_triton.py). Nothing leaves the device."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.moe_sort_reference import moe_sort_reference
from v4serve.ops.moe_sort_triton import moe_sort_triton


def moe_sort(experts: torch.Tensor, n_experts: int, impl="auto") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows [T*k] int64, ends [n_experts] int32, pos [T*k] int64) for experts [T, k] (ids in
    [0, n_experts)): the picks stably sorted by expert, `rows` their tokens, `ends` the cumulative
    group ends, `pos[t*k + i]` the sorted position of token t's i-th pick."""
    if experts.dim() != 2 or experts.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"experts must be an integer [T, k] tensor, got {experts.dtype} {tuple(experts.shape)}")
    if use_triton(impl, experts):
        return moe_sort_triton(experts, n_experts)
    return moe_sort_reference(experts, n_experts)
