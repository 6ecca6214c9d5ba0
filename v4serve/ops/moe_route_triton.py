"""Triton kernel of MoE routing (math: moe_route_reference.py).

Layouts: logits [T, E] bf16 or fp32 (row stride `stride_l`, unit along E); bias [E] fp32 or bf16 (score
layers) or tid2eid [V, TOP_K] int64 and token_ids [T] int64 (hash layers); optional rows [T] int64
(token t reads logits row and token id rows[t]); outputs experts [T, TOP_K] int64 and weights
[T, TOP_K] fp32, contiguous.

One program per BLOCK_T tokens holds their [BLOCK_T, E] scores in registers (E = 256 in V4) and
replaces the ~12 launches of the torch path (cast, softplus, sqrt, bias add, top-k, gather, sum,
divide, scale). Top-k is TOP_K rounds of argmax over the biased scores, each removing its pick: the
experts come out by descending biased score, ties to the lower expert id. Softplus follows torch
(beta 1, threshold 20) with an accurate log1p (log(u) * e / (u - 1), u = 1 + e), so very negative
logits keep their relative precision.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

MOE_ROUTE_CONFIG = dict(BLOCK_T=4, num_warps=4)
SCORING_IDS = {"sqrtsoftplus": 0, "sigmoid": 1, "softmax": 2}


@triton.jit
def _softplus(x):
    e = tl.exp(tl.minimum(x, 20.0))
    u = 1.0 + e
    log1p_e = tl.where(u == 1.0, e, tl.log(u) * (e / tl.where(u == 1.0, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, log1p_e)


@triton.jit
def _moe_route_kernel(
    logit_ptr, bias_ptr, tid2eid_ptr, token_ptr, rows_ptr, experts_ptr, weights_ptr, T, E, stride_l, scaling,
    TOP_K: tl.constexpr, SCORING: tl.constexpr, NORMALIZE: tl.constexpr, HASHED: tl.constexpr, HAS_ROWS: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < T
    src = t.to(tl.int64)  # the row routed as token t
    if HAS_ROWS:
        src = tl.load(rows_ptr + t, mask=t_ok, other=0)
    e = tl.arange(0, BLOCK_E)
    ok = t_ok[:, None] & (e < E)[None, :]
    x = tl.load(logit_ptr + src[:, None] * stride_l + e[None, :], mask=ok, other=0.0).to(tl.float32)
    if SCORING == 0:
        scores = tl.sqrt(_softplus(x))
    elif SCORING == 1:
        scores = tl.sigmoid(x)
    else:
        x = tl.where((e < E)[None, :], x, float("-inf"))
        p = tl.exp(x - tl.max(x, axis=1)[:, None])
        scores = p / tl.sum(p, axis=1)[:, None]
    slot = tl.arange(0, BLOCK_K)
    slot_ok = slot < TOP_K
    if HASHED:
        tok = tl.load(token_ptr + src, mask=t_ok, other=0)
        experts = tl.load(tid2eid_ptr + tok[:, None] * TOP_K + slot[None, :],
                          mask=t_ok[:, None] & slot_ok[None, :], other=0).to(tl.int32)
    else:
        biased = tl.where(ok, scores + tl.load(bias_ptr + e, mask=e < E, other=0.0).to(tl.float32)[None, :], float("-inf"))
        experts = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int32)
        for i in tl.static_range(TOP_K):
            best = tl.argmax(biased, axis=1, tie_break_left=True).to(tl.int32)
            experts = tl.where(slot[None, :] == i, best[:, None], experts)
            biased = tl.where(e[None, :] == best[:, None], float("-inf"), biased)
    weights = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    for i in tl.static_range(TOP_K):
        expert = tl.sum(tl.where(slot[None, :] == i, experts, 0), axis=1)
        picked = tl.sum(tl.where(e[None, :] == expert[:, None], scores, 0.0), axis=1)
        weights = tl.where(slot[None, :] == i, picked[:, None], weights)
    if NORMALIZE:
        weights = weights / (tl.sum(weights, axis=1)[:, None] + 1e-20)
    out = t.to(tl.int64)[:, None] * TOP_K + slot[None, :]
    out_ok = t_ok[:, None] & slot_ok[None, :]
    tl.store(experts_ptr + out, experts.to(tl.int64), mask=out_ok)
    tl.store(weights_ptr + out, weights * scaling, mask=out_ok)


def moe_route_triton(logits, top_k: int, scoring_func: str, normalize: bool, scaling: float, bias=None,
                     tid2eid=None, token_ids=None, rows=None) -> tuple[torch.Tensor, torch.Tensor]:
    T, E = logits.shape
    logits = logits if logits.stride(1) == 1 else logits.contiguous()
    experts = torch.empty(T, top_k, dtype=torch.int64, device=logits.device)
    weights = torch.empty(T, top_k, dtype=torch.float32, device=logits.device)
    if T == 0:
        return experts, weights
    hashed = tid2eid is not None
    bias = logits if hashed else bias.contiguous()  # fp32 or the model's dtype; widened in the kernel
    tid2eid = tid2eid.contiguous() if hashed else experts
    token_ids = token_ids.contiguous() if hashed else experts
    rows_arg = experts if rows is None else rows.to(torch.int64).contiguous()
    cfg = MOE_ROUTE_CONFIG
    _moe_route_kernel[(triton.cdiv(T, cfg["BLOCK_T"]),)](
        logits, bias, tid2eid, token_ids, rows_arg, experts, weights, T, E, logits.stride(0), float(scaling),
        TOP_K=top_k, SCORING=SCORING_IDS[scoring_func], NORMALIZE=bool(normalize), HASHED=hashed,
        HAS_ROWS=rows is not None,
        BLOCK_E=triton.next_power_of_2(E), BLOCK_K=triton.next_power_of_2(top_k), **cfg, **pdl_launch(logits),
    )
    return experts, weights
