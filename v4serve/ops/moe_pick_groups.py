"""The picks of one expert a tensor-core MoE decode program serves (mxfp4_moe_mma_gluon.py's
GROUPED): public entry point (math in moe_pick_groups_reference.py, kernel in
moe_pick_groups_triton.py). One launch a decode step's layer, read by both projections."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.moe_pick_groups_reference import moe_pick_groups_reference
from v4serve.ops.moe_pick_groups_triton import moe_pick_groups_triton


def moe_pick_groups(experts: torch.Tensor, group: int, impl: str = "auto") -> torch.Tensor:
    """members int32 [P, group] for experts [P] (contiguous integer ids >= 0): row p lists the picks
    of p's expert that p's program serves (p first) when p leads its run of `group`, else -1s."""
    if experts.dim() != 1 or experts.is_floating_point() or not experts.is_contiguous():
        raise ValueError(f"experts must be contiguous integer ids [P], got {experts.dtype} {tuple(experts.shape)}")
    if group < 1 or group & (group - 1):
        raise ValueError(f"group must be a power of two, got {group}")
    if use_triton(impl, experts):
        return moe_pick_groups_triton(experts, group)
    return moe_pick_groups_reference(experts, group)
