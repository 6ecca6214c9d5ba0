"""Projections that read the same input, run as one matrix multiply.

After the weights are loaded, `fuse_rows` stacks the weights of a group of projections into one
matrix and turns each member's weight into a view of its rows: one copy in memory, one GEMM per
step instead of several (fewer launches, a wider GEMM), while every member still works on its own
and the checkpoint names are unchanged. Fused matrices are non-persistent buffers, so state_dict
and save_pretrained see only the members. `DeepseekV4ForCausalLM.fuse_projections` names the groups.

FP8 members (`fuse_fp8_rows`): q_a + kv of a V4 / V4-Pro layer are both FP8 with the same blocks
and read the same x; where every member but the last has a row count that is a multiple of the
block's rows (Flash q_lora_rank 1024, Pro 1536: 128-row blocks), their block scales stack too
(`scale[n // bn, k // bk]` of the stacked weight is the member's block), so one `FP8Linear` over
the stacked codes and scales computes both products bit for bit as the members would
row by row: the same K sums per output (the decode kernels split K the same way whatever N tile
holds a row, except where the wider N changes the split that fills the GPU: then the fp32 sum
order of the K splits differs, well under one bf16 ulp). At decode it saves one launch (and its
split-K sum) a layer. Its codes and scales are non-persistent buffers of that module, as above.
Not fused: the router (bf16) with the shared experts (FP8), which cannot be one FP8 GEMM; and
DeepSeek-V4.1's FP8 linears, which round their input by a forward pre-hook
(`v41_quant.quantize_linear_inputs`): a fused module would need the same hook again on a module
the loader does not know, for one launch a layer not measured yet; they stay apart (`fusable`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from v4serve.model.quantized import FP8Linear


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


def fp8_fusable(members: list[nn.Module]) -> bool:
    """FP8 linears with the same input width, blocks and activation numerics, no input pre-hook, and
    row counts (all but the last) that are whole blocks of rows, so that their block scales stack."""
    first = members[0]
    return (all(type(m) is FP8Linear and not m._forward_pre_hooks for m in members)
            and all(m.in_features == first.in_features and m.block == first.block and m.act_block == first.act_block
                    for m in members)
            and all(m.weight.shape[0] % first.block[0] == 0 for m in members[:-1]))


@torch.no_grad()
def fuse_fp8_rows(members: list[nn.Module]) -> FP8Linear | None:
    """One FP8Linear over the members' stacked codes [sum N_i, K] and block scales [sum N_i / bn, K / bk]
    (non-persistent buffers), the members' weight and weight_scale_inv turned into views of their
    rows; None (nothing changed) unless `fp8_fusable`."""
    if not fp8_fusable(members):
        return None
    first = members[0]
    codes = torch.cat([m.weight.detach() for m in members])
    scales = torch.cat([m.weight_scale_inv.detach() for m in members])
    with torch.device("meta"):
        fused = FP8Linear(first.in_features, codes.shape[0], first.block, first.act_block)
    for name, stacked in (("weight", codes), ("weight_scale_inv", scales)):
        delattr(fused, name)
        fused.register_buffer(name, stacked, persistent=False)
    fused.impl = first.impl
    rows, blocks = 0, 0
    for m in members:
        n, nb = m.weight.shape[0], m.weight_scale_inv.shape[0]
        m.weight = nn.Parameter(codes[rows:rows + n], requires_grad=False)
        m.weight_scale_inv = nn.Parameter(scales[blocks:blocks + nb], requires_grad=False)
        rows, blocks = rows + n, blocks + nb
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
