"""MoE routing (scores, biased top-k or hash table, normalised weights): public entry point (math in
moe_route_reference.py, kernel in moe_route_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.moe_route_reference import SCORING_FUNCS, moe_route_reference
from v4serve.ops.moe_route_triton import moe_route_triton


def moe_route(
    logits: torch.Tensor, top_k: int, scoring_func: str, normalize: bool, scaling: float,
    bias: torch.Tensor | None = None, tid2eid: torch.Tensor | None = None, token_ids: torch.Tensor | None = None,
    rows: torch.Tensor | None = None, impl="auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """(experts [T, k] int64, weights [T, k] fp32) from router logits [T, E].

    Score layers pass `bias` [E] (selection by top-k of score + bias); hash layers pass `tid2eid`
    [V, k] and `token_ids` [T]. The order of a token's k experts is unspecified (the kernel gives
    them by descending biased score, ties to the lower expert id; torch.topk(sorted=False) by its own
    rule). `rows` [T] (integers in [0, T)), when given, routes token t as token rows[t]: a padded
    decode batch points its padding rows at live rows, so they add no experts to the step."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [T, E], got {tuple(logits.shape)}")
    if scoring_func not in SCORING_FUNCS:
        raise ValueError(f"scoring_func must be one of {SCORING_FUNCS}, got {scoring_func!r}")
    hashed = tid2eid is not None
    if hashed == (bias is not None) or hashed != (token_ids is not None):
        raise ValueError("pass either bias (score layers) or tid2eid and token_ids (hash layers)")
    if hashed and (tid2eid.dim() != 2 or tid2eid.shape[1] != top_k or token_ids.shape != logits.shape[:1]):
        raise ValueError(f"tid2eid must be [V, {top_k}] and token_ids [{logits.shape[0]}], got "
                         f"{tuple(tid2eid.shape)} and {tuple(token_ids.shape)}")
    if not hashed and (bias.shape != logits.shape[1:] or not 0 < top_k <= logits.shape[1]):
        raise ValueError(f"bias must be [{logits.shape[1]}] and 0 < top_k <= {logits.shape[1]}, got "
                         f"{tuple(bias.shape)} and {top_k}")
    if rows is not None and (rows.shape != logits.shape[:1] or rows.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"rows must be integer [{logits.shape[0]}], got {rows.dtype} {tuple(rows.shape)}")
    if use_triton(impl, logits):
        return moe_route_triton(logits, top_k, scoring_func, normalize, scaling, bias, tid2eid, token_ids, rows)
    return moe_route_reference(logits, top_k, scoring_func, normalize, scaling, bias, tid2eid, token_ids, rows)
