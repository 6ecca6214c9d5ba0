"""Projections that read the same input, run as one matrix multiply.

After the weights are loaded, `fuse_rows` stacks the weights of a group of projections into one
matrix and turns each member's weight into a view of its rows: one copy in memory, one GEMM per
step instead of several (fewer launches, a wider GEMM), while every member still works on its own
and the checkpoint names are unchanged. Fused matrices are non-persistent buffers, so state_dict
and save_pretrained see only the members. `DeepseekV4ForCausalLM.fuse_projections` names the groups.

Quantized members are not fused (`fuse_rows` returns None and the caller keeps its unfused
path): the router is BF16 while the shared experts are FP8 in the official checkpoint, so that
group cannot be one FP8 GEMM; q_a + kv could be (both FP8, row counts multiples of the 128-row
block, so the block scales would stack too), but their decode GEMMs are bandwidth-bound on the
weight bytes, which fusing does not change: it would save one launch per layer, not measured yet.
"""

from __future__ import annotations

import torch
from torch import nn


def fusable(members: list[nn.Module]) -> bool:
    """Plain linears only (nn.Linear weights in a floating dtype that is not FP8), none of which
    transforms its input first (a forward pre-hook: V4.1's FP8-GEMM input rounding,
    `v41_quant.quantize_linear_inputs`, which one fused GEMM would skip)."""
    return all(type(m.weight) is nn.Parameter and m.weight.is_floating_point() and m.weight.element_size() > 1
               and not hasattr(m, "weight_scale_inv") and not m._forward_pre_hooks for m in members)


@torch.no_grad()
def fuse_rows(members: list[nn.Module]) -> torch.Tensor | None:
    """Stack the members' `weight` [N_i, K] into one [sum N_i, K] and make each a view of its rows;
    None (nothing changed) when a member is quantized."""
    if not fusable(members):
        return None
    fused = torch.cat([m.weight.detach() for m in members])
    offset = 0
    for m in members:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(fused[offset:offset + n], requires_grad=False)
        offset += n
    return fused


def widths(members: list[nn.Module]) -> list[int]:
    """The members' output widths, to split the fused product."""
    return [m.weight.shape[0] for m in members]
