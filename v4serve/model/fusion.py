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
import torch.nn.functional as F
from torch import nn


def fusable(members: list[nn.Module]) -> bool:
    """Plain linears only (nn.Linear weights in a floating dtype that is not FP8), none of which
    transforms its input first (a forward pre-hook: V4.1's FP8-GEMM input rounding,
    `v41_quant.quantize_linear_inputs`, which one fused GEMM would skip)."""
    return all(type(m.weight) is nn.Parameter and m.weight.is_floating_point() and m.weight.element_size() > 1
               and not hasattr(m, "weight_scale_inv") and not m._forward_pre_hooks for m in members)


@torch.no_grad()
def fuse_rows(members: list[nn.Module], dtype: torch.dtype | None = None) -> torch.Tensor | None:
    """Stack the members' `weight` [N_i, K] into one [sum N_i, K] (in `dtype`: None keeps theirs)
    and make each a view of its rows; None (nothing changed) when a member is quantized."""
    if not fusable(members):
        return None
    fused = torch.cat([m.weight.detach() for m in members]).to(dtype or members[0].weight.dtype)
    offset = 0
    for m in members:
        n = m.weight.shape[0]
        m.weight = nn.Parameter(fused[offset:offset + n], requires_grad=False)
        offset += n
    return fused


def widths(members: list[nn.Module]) -> list[int]:
    """The members' output widths, to split the fused product."""
    return [m.weight.shape[0] for m in members]


@torch.no_grad()
def bf16_storage_fits(members: list[nn.Module], activation_dtype: torch.dtype) -> bool:
    """The members' fp32 weights can be stored as bf16 for `fp32_product`: every value is a bf16
    value (the checkpoint tensors are bf16; the reference widens them to multiply in fp32), the
    activations are bf16, and the device multiplies bf16 into an fp32 result (CUDA)."""
    weights = [m.weight for m in members]
    if activation_dtype != torch.bfloat16 or not all(w.dtype == torch.float32 and w.is_cuda for w in weights):
        return False
    if not all(torch.equal(w, w.bfloat16().float()) for w in weights):
        return False
    try:
        probe = torch.zeros(1, 16, dtype=torch.bfloat16, device=weights[0].device)
        torch.mm(probe, probe.t(), out_dtype=torch.float32)
    except (RuntimeError, TypeError):  # a torch without mm's out_dtype (2.8+)
        return False
    return True


def fp32_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [T, K] times weight [N, K]^T with fp32 products and sums, returned in fp32: x widened to
    fp32 against an fp32 weight, or, for a bf16 weight (`bf16_storage_fits`), bf16 x and bf16 weight
    multiplied into fp32 by cuBLAS (the same exact products: bf16 x bf16 fits fp32; half the weight
    bytes, no widening launch)."""
    if weight.dtype == torch.float32:
        return F.linear(x.float(), weight)
    if x.is_cuda and x.dtype == weight.dtype:
        return torch.mm(x, weight.t(), out_dtype=torch.float32)
    return F.linear(x.float(), weight.float())
