"""Cuts of the quantized modules for tensor / expert parallelism (used by `shard.py`).

A quantized weight is cut together with its scales, and a cut may only fall where the scales
do not have to be split:

FP8Linear (`model/quantized.py`): e4m3 codes [N, K] + fp32 scales [ceil(N/bn), ceil(K/bk)].
    column-parallel (rows of the output, dim 0): every kept run of rows [a, b) has a % bn == 0 and
        b % bn == 0 or b == N; the kept scale rows are the blocks the runs cover, [a/bn, ceil(b/bn)).
    row-parallel (columns of the input, dim 1): the same along K with bk, and with the official
        activation quantization (`act_block`) also a % act_block == 0: an activation group split
        between ranks would be quantized with another amax than in one process.
    V4 checkpoints use 128 x 128 blocks, V4.1 32 x 32; the check reads the module's own `block`.
MXFP4Experts: packed e2m1 [E, 2I, D/2] / [E, D, I/2] + ue8m0 bytes per 32 elements along K.
    TP: gate_up rows [gate_r; up_r] (dim 1: any rows; the scales run along D, which stays whole)
        and down_proj's K = the intermediate channels [i0, i1): whole 32-element groups
        (i0 % 32 == i1 % 32 == 0), i.e. packed bytes [i0/2, i1/2) and scale bytes [i0/32, i1/32).
    EP: experts [e0, e1) of all four tensors (dim 0).

A cut that would split a block raises a ValueError naming the layer, the cut and the block.
"""

from __future__ import annotations

from v4serve.model.quantized import MX_BLOCK, FP8Linear, MXFP4Experts


def runs(keep: list[int]) -> list[tuple[int, int]]:
    """[a, b) runs of consecutive indices in `keep` (sorted)."""
    out, start = [], keep[0]
    for prev, k in zip(keep, [*keep[1:], None]):
        if k != prev + 1:
            out.append((start, prev + 1))
            start = k
    return out


def _block_cut(name: str, what: str, keep: list[int], total: int, block: int, size: int,
               act_block: int | None = None) -> list[int]:
    """The kept scale blocks of a cut of `keep` out of `total` along a dim blocked by `block`."""
    blocks: list[int] = []
    for a, b in runs(keep):
        aligned = a % block == 0 and (b % block == 0 or b == total)
        if act_block is not None:
            aligned = aligned and a % act_block == 0 and (b % act_block == 0 or b == total)
        if not aligned:
            step = block if act_block is None else f"{block} (activation groups of {act_block})"
            raise ValueError(
                f"tensor_parallel_size {size}: {name} would be cut at {what} {a}..{b - 1} of {total}, which splits "
                f"its FP8 scale blocks of {step} {what}; its sharded dimension must be a multiple of the block per "
                f"rank (use another tensor_parallel_size, or quantization='none' on a bf16 checkpoint)")
        blocks += range(a // block, -(-b // block))
    return blocks


def cut_fp8_linear(sharder, module: FP8Linear, dim: int, keep: list[int]) -> None:
    """Cut `module` to rows (dim 0) or input columns (dim 1) `keep`, its scales with it."""
    name = sharder.module_name(module)
    total = module.weight.shape[dim]
    what = "output rows" if dim == 0 else "input columns"
    act = module.act_block if dim == 1 else None
    blocks = _block_cut(name, what, keep, total, module.block[dim], sharder.group.size, act)
    sharder.cut(module, "weight", dim, keep)
    sharder.cut(module, "weight_scale_inv", dim, blocks)
    module.out_features, module.in_features = module.weight.shape


def cut_mxfp4_experts(sharder, module: MXFP4Experts, intermediate: range | None, experts: range | None) -> None:
    """TP (`intermediate`: this rank's channels of I) or EP (`experts`: this rank's experts)."""
    if experts is not None:
        for tensor in ("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv"):
            sharder.cut(module, tensor, 0, list(experts))
        module.n_experts = len(experts)
        return
    i = module.down_proj.shape[2] * 2
    a, b = intermediate.start, intermediate.stop
    if a % MX_BLOCK or b % MX_BLOCK:
        raise ValueError(
            f"tensor_parallel_size {sharder.group.size}: {sharder.module_name(module)} would be cut at intermediate "
            f"channels {a}..{b - 1} of {i}, which splits its MXFP4 scale groups of {MX_BLOCK} channels; "
            f"moe_intermediate_size / tensor_parallel_size must be a multiple of {MX_BLOCK} "
            "(or use enable_expert_parallel)")
    rows = [*intermediate, *(i + c for c in intermediate)]
    sharder.cut(module, "gate_up_proj", 1, rows)
    sharder.cut(module, "gate_up_proj_scale_inv", 1, rows)
    sharder.cut(module, "down_proj", 2, list(range(a // 2, b // 2)))
    sharder.cut(module, "down_proj_scale_inv", 2, list(range(a // MX_BLOCK, b // MX_BLOCK)))
