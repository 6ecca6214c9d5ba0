"""Torch reference of MoE routing: expert ids and weights of each token from its router logits.

    s   = score(logits)        sqrtsoftplus: sqrt(softplus(.)) | sigmoid | softmax over experts
    sel = top-k(s + bias)      (score layers)   |   tid2eid[token_id]   (hash layers)
    w   = s[sel] / (sum s[sel] + 1e-20) * scaling     (the division only when `normalize`)

The unbiased scores weigh the experts; the bias only steers the selection. fp32 throughout.
With `rows` [T], token t is routed as token rows[t] (its logits row and token id): a decode graph
padded past its live rows routes the padding like live rows, so it streams no extra experts.
"""

import torch
import torch.nn.functional as F

SCORING_FUNCS = ("sqrtsoftplus", "sigmoid", "softmax")


def expert_scores(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    if scoring_func == "sqrtsoftplus":
        return F.softplus(logits).sqrt()
    if scoring_func == "sigmoid":
        return torch.sigmoid(logits)
    return torch.softmax(logits, dim=-1)


def moe_route_reference(
    logits: torch.Tensor, top_k: int, scoring_func: str, normalize: bool, scaling: float,
    bias: torch.Tensor | None = None, tid2eid: torch.Tensor | None = None, token_ids: torch.Tensor | None = None,
    rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    if rows is not None:
        logits = logits[rows]
        token_ids = None if token_ids is None else token_ids[rows]
    scores = expert_scores(logits.float(), scoring_func)
    if tid2eid is not None:
        experts = tid2eid[token_ids].long()
    else:
        experts = torch.topk(scores + bias, top_k, dim=-1, sorted=False).indices
    weights = scores.gather(1, experts)
    if normalize:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return experts, weights * scaling
