"""The MXFP4 routed experts of one layer, from the router's picks to the combined output: public entry
point (V4 numerics: the clamped SwiGLU fused into the gate_up projection, weights applied in the
combine). Math: `reference` below (moe_sort, mxfp4_grouped_matmul, moe_combine); kernels: the
sort-free decode path in mxfp4_moe_decode_triton.py, else the sorted one.

    out[t] = sum_i w[t, i] W2[e_ti] clamped_swiglu(W13[e_ti] x[t])  (+ add[t])

Decode batches (`gemv_picks` = 1: one pick a GEMV program) skip the sort: each program reads its
expert id from `experts` and its activation row directly; y stays in pick order and the combine
reads it so. Every output has the sorted path's bits: a pick's row of y depends only on its token's
row, its expert and the tiles (the same GEMV device functions, the same tiles), and the combine
adds the same rows in the same slot order. `COMBINE_IN_DOWN` (the production rule, one line) moves
the combine into the down launch (the last-arriving program of each token's column tile sums it;
needs the caller's `arrivals` counters): one launch fewer again, a ticket atomic per program.

`tensor_cores=True` runs both projections of a decode batch of bf16 x on tensor cores instead
(mxfp4_moe_mma_gluon.py on sm_90 where its shapes fit, else mxfp4_moe_mma_triton.py; the combine
its own launch, as above), sort-free up to TENSOR_CORE_SORT_FREE_PICKS x E picks (the GEMV: 0.75 E).
The decoded weights are the MMA's bf16 operand, so the products are exact and only the fp32 sum
order changes (the MMA's k16 chunks):

    |y - y_gemv| <= gamma_K sum_k |w x|   per projection, before the bf16 rounding of y

Not the GEMV's bits, but still independent of the batch (a pick's column of the MMA sums as
column 0 does: verify = decode). On the Gluon kernel a launch of more than 48 picks groups the picks
of one expert (one `moe_pick_groups` table a layer, read by both projections), and down is gate_up's
programmatic dependent launch (mxfp4_moe_mma_gluon.py says both). Exact only when every scale byte
is <= 128 (`mma_scales_exact`), which the caller checks once where the weights are loaded
(`MXFP4Experts.bind_decode`), never per launch.

A layer with experts in host memory (model/quantized_offload.py) runs its decode steps through
the same route, in passes (`mxfp4_experts_pass`: gate_up and down a pass, on the GEMV or on tensor
cores as the layer is bound), each pass writing its own picks' rows of one hidden and one y (the
other picks carry an expert id past the weight's rows, which the kernels skip: no load, no
store), then one combine: the bits of the resident layer, in 2 launches a pass and the combine
(the sorted passes: a sort, 2 GEMVs and a gather a pass, a compare and a where to merge each
further pass, the combine). Larger batches (prefill), V4.1's numerics and the torch ops keep the
offload's sorted passes.
"""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.moe_combine import moe_combine
from v4serve.ops.moe_sort import moe_sort
from v4serve.ops.mxfp4_gemv_triton import gemv_picks
from v4serve.ops.mxfp4_grouped_matmul import mxfp4_grouped_matmul
from v4serve.ops.mxfp4_moe_decode_triton import combine_tiles, mxfp4_moe_pick_triton
from v4serve.ops.moe_pick_groups import moe_pick_groups
from v4serve.ops.mxfp4_moe_mma_gluon import GROUP, gluon_applies, groups_apply, mxfp4_moe_mma_gluon
from v4serve.ops.mxfp4_moe_mma_triton import mxfp4_moe_mma_triton

# The production rules of the sort-free path, one line each (docs/performance.md, "Session 14: the
# MXFP4 MoE layer at decode without the pick sort" says which `kernel_configs 'moe flash'` row
# switches which): the combine inside the down launch, off until the H200 says it is faster; the
# (gate_up, down) tiles, None = the sorted GEMV's one-pick tiles (`gemv_config(1, swiglu)`).
COMBINE_IN_DOWN = False
SORT_FREE_CONFIGS = (None, None)
# The decode route of V4's MXFP4 experts, production's rule: False = the sort-free GEMV above (fp32
# FMA chains, the sorted path's bits), True = tensor cores wherever the loader finds every scale
# byte <= 128 (`MXFP4Experts.bind_decode`). It changes the bits of every MoE layer at decode (fp32
# sums in the MMA's order: within gamma_K sum |w x| of the reference a projection; a row still
# independent of the batch, so verify = decode). Measured on the H200 (session 16, `kernel_configs
# 'moe flash'`, one Flash layer, µs, GEMV vs "sort-free mma, Gluon"): c1 42.2 vs 43.1, c8 246.9 vs
# 219.7, verify c16 464.2 vs 410.0, c32 909.5 vs 789.1; the 43-layer offloaded stage c1 10.13 ms
# with it (docs/performance.md "Session 16").
TENSOR_CORE_DECODE = True
# Picks per expert up to which the tensor-core route stays sort-free (the GEMV's bound is 0.75 E,
# `gemv_picks`): measured at 1.5 E (Flash c64, 384 picks, session 16 `kernel_configs 'moe flash c'`):
# "sort-free mma, Gluon" 1530 µs against the sorted path's 2036 (the experts' re-reads come from L2).
TENSOR_CORE_SORT_FREE_PICKS = 1.5


def sorted_experts(x, experts, weights, tensors, swiglu_limit, add=None, impl="auto", tile_experts=None):
    """The sorted path (and, with impl="torch", the reference): picks sorted by expert, the two
    grouped matmuls (SwiGLU fused into the first), the combine un-sorting and summing them."""
    w13, s13, w2, s2 = tensors
    rows, ends, pos = moe_sort(experts, w13.shape[0], impl=impl)
    tiles = dict(impl=impl, tile_experts=tile_experts)
    hidden = mxfp4_grouped_matmul(x, w13, s13, rows, ends, swiglu_limit=swiglu_limit, **tiles)
    return moe_combine(mxfp4_grouped_matmul(hidden, w2, s2, None, ends, **tiles), pos, weights, add, impl=impl)


def on_tensor_cores(tensor_cores: bool, x: torch.Tensor) -> bool:
    """The route a call takes: tensor cores when asked for and x is bf16 (their operand), else the GEMV."""
    return tensor_cores and x.dtype == torch.bfloat16


def direct_applies(impl: str, x: torch.Tensor, experts: torch.Tensor, tensors, tile_experts: int | None = None,
                   tensor_cores: bool = False) -> bool:
    """The sort-free path runs: Triton, and one pick a GEMV program for this many picks; on the
    tensor-core route up to TENSOR_CORE_SORT_FREE_PICKS x E picks."""
    n_experts = tile_experts or tensors[0].shape[0]
    if not use_triton(impl, x, *tensors):
        return False
    if on_tensor_cores(tensor_cores, x):
        return experts.numel() <= TENSOR_CORE_SORT_FREE_PICKS * n_experts
    return gemv_picks(experts.numel(), n_experts) == 1


def mxfp4_experts(x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor, tensors, swiglu_limit: float,
                  add: torch.Tensor | None = None, impl: str = "auto", tile_experts: int | None = None,
                  arrivals: torch.Tensor | None = None, combine_in_down: bool = COMBINE_IN_DOWN,
                  configs: tuple = SORT_FREE_CONFIGS, decode: str | None = None,
                  tensor_cores: bool = False) -> torch.Tensor:
    """out [T, D] in x.dtype. x [T, D] bf16 / fp16 / fp32; experts [T, k] int (ids < E, as the
    router gives them); weights [T, k] fp32; tensors = (gate_up uint8 [E, 2I, D/2], its ue8m0 scales
    [E, 2I, D/32], down [E, D, I/2], its scales [E, D, I/32]); add [T, D] in x.dtype (the shared
    expert) or None. `tile_experts`: the layer's E for the kernel choice (`mxfp4_grouped_matmul`).
    `arrivals`: int32 zeros [>= T cdiv(D, BLOCK_N)] the caller keeps, for the combine in the down
    launch (without them, or too few, the combine is its own launch). `configs` (gate_up, down)
    and `decode` ("asm" / "bits"): the GEMV tiles and word decoder of the sort-free path (default:
    production's). `tensor_cores`: the decode route on tensor cores (see the module docstring; for
    bf16 x, other dtypes keep the GEMV), only for weights whose scale bytes are all <= 128."""
    if experts.shape != weights.shape or experts.dim() != 2 or x.dim() != 2 or experts.shape[0] != x.shape[0]:
        raise ValueError(f"experts and weights must be [T, k] for x [T, D], got {tuple(experts.shape)}, "
                         f"{tuple(weights.shape)} and {tuple(x.shape)}")
    if not direct_applies(impl, x, experts, tensors, tile_experts, tensor_cores):
        return sorted_experts(x, experts, weights, tensors, swiglu_limit, add, impl, tile_experts)
    w13, s13, w2, s2 = tensors
    t, k = experts.shape
    weights = weights.float().contiguous()
    if (combine_in_down and not on_tensor_cores(tensor_cores, x) and arrivals is not None
            and arrivals.numel() >= t * combine_tiles(w2.shape[1], configs[1])):
        flat = experts.reshape(-1).contiguous()
        hidden = mxfp4_moe_pick_triton(x, w13, s13, flat, k, True, configs[0], swiglu_limit, decode)
        return mxfp4_moe_pick_triton(hidden, w2, s2, flat, k, False, configs[1], decode=decode,
                                     combine=(weights, add, arrivals))
    _, y = mxfp4_experts_pass(x, experts, tensors, swiglu_limit, tensor_cores=tensor_cores, configs=configs,
                              decode=decode, skip_past_rows=False)
    return moe_combine(y, None, weights, add, impl=impl)


def mxfp4_experts_pass(x: torch.Tensor, groups: torch.Tensor, tensors, swiglu_limit: float,
                       outputs: tuple | None = None, tensor_cores: bool = False,
                       configs: tuple = SORT_FREE_CONFIGS, decode: str | None = None,
                       skip_past_rows: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """The two projections of `mxfp4_experts`' sort-free route, (hidden [T k, I], y [T k, D]) in
    pick order (groups [T, k]: the row of `tensors`, leading dim G, of each pick). One pass of a
    decode step whose picks are split over passes (model/quantized_offload.py): the picks whose
    group is < G get their rows written, the others (group >= G: another pass's) are skipped and
    their rows left as they are (`skip_past_rows`; False: every group is a row, as in
    `mxfp4_experts`). `outputs`: the (hidden, y) of the step's earlier passes, None in the first
    (made here). Once every pick has had its pass, `moe_combine(y, None, weights, add)` is
    `mxfp4_experts`' output bit for bit (each row of y has the same bits as there: the same
    kernels, tiles and route; the caller checks `direct_applies` at the layer's E, as
    `mxfp4_experts` does)."""
    w13, s13, w2, s2 = tensors
    k = groups.shape[1]
    flat = groups.reshape(-1).contiguous()
    hidden, y = outputs or (None, None)
    skip = dict(skip_past_rows=skip_past_rows)
    if on_tensor_cores(tensor_cores, x):
        members = (moe_pick_groups(flat, GROUP) if gluon_applies(x, w13, True) and groups_apply(flat.numel())
                   else None)  # one table for both projections
        hidden = tensor_core_projection(x, w13, s13, flat, k, True, swiglu_limit, y=hidden, members=members,
                                        pdl="gate_up", **skip)
        return hidden, tensor_core_projection(hidden, w2, s2, flat, k, False, y=y, members=members, pdl="down",
                                              **skip)
    hidden = mxfp4_moe_pick_triton(x, w13, s13, flat, k, True, configs[0], swiglu_limit, decode, y=hidden, **skip)
    return hidden, mxfp4_moe_pick_triton(hidden, w2, s2, flat, k, False, configs[1], decode=decode, y=y, **skip)


def tensor_core_projection(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, experts: torch.Tensor,
                           top_k: int, per_token: bool, swiglu_limit: float | None = None,
                           y: torch.Tensor | None = None, skip_past_rows: bool = False,
                           members: torch.Tensor | None = None, pdl: str | None = None) -> torch.Tensor:
    """One projection of the tensor-core route, y [T k, N] in pick order: the Gluon kernel on sm_90
    where its shapes fit (grouped by `members`, the launch's moe_pick_groups table, where given), else
    the `tl` one (any GPU, the interpreter). pdl, the Gluon kernel's programmatic dependent launches:
    "gate_up" (launched while the launch before it finishes, waiting for it first, then letting down
    start), "down" (right after such a gate_up: its first weights requested while gate_up finishes;
    the combine after it may start early when its grid is one wave). `y`, `skip_past_rows`: as
    `mxfp4_moe_pick_triton`'s."""
    rows = dict(y=y, skip_past_rows=skip_past_rows)
    if gluon_applies(x, weight, swiglu_limit is not None):
        launch = (dict(pdl_wait_first=True, pdl_trigger=True) if pdl == "gate_up"
                  else dict(pdl_wait=True, pdl_trigger=None) if pdl == "down" else {})
        return mxfp4_moe_mma_gluon(x, weight, scale, experts, top_k, per_token, swiglu_limit,
                                   grouped=members is not None, members=members, **launch, **rows)
    return mxfp4_moe_mma_triton(x, weight, scale, experts, top_k, per_token, swiglu_limit=swiglu_limit, **rows)


def combine_counters_size(n_experts: int, top_k: int, d: int) -> int:
    """Arrival counters for the largest decode batch the sort-free path takes (4 T k <= 3 E)."""
    return (3 * n_experts // 4 // top_k + 1) * combine_tiles(d)
