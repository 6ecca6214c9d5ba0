"""Projections that read the same input, run as one matrix multiply.

After the weights are loaded, `fuse_rows` stacks the weights of a group of projections into one
matrix and turns each member's weight into a view of its rows: one copy in memory, one GEMM per
step instead of several (fewer launches, a wider GEMM), while every member still works on its own
and the checkpoint names are unchanged. Fused matrices are non-persistent buffers, so state_dict
and save_pretrained see only the members. `DeepseekV4ForCausalLM.fuse_projections` names the groups.
"""

from __future__ import annotations

import torch
from torch import nn


@torch.no_grad()
def fuse_rows(members: list[nn.Module]) -> torch.Tensor:
    """Stack the members' `weight` [N_i, K] into one [sum N_i, K] and make each a view of its rows."""
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
