"""The lightning indexer's top-k: the torch reference (a stable descending sort).

For each row b of scores [..., T] (fp32) and k <= T:

    order[b]          = the columns 0..T-1 sorted by (score desc, column asc)
    columns[b, j]     = order[b, j]                 j < k    (int64, the sort's index dtype)
    values[b, j]      = scores[b, columns[b, j]]

so the picks are the k largest scores, largest first, equal scores in column order (the lower
column first; random weights make exact ties common: a key whose every head has relu(q.k) = 0
scores 0). -inf (a masked key) is the smallest score: those columns come last, in column order.
NaN does not occur (the scores are sums of finite products, or -inf where masked).
"""

import torch


def index_topk_reference(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values [..., k], columns [..., k] int64) of the stable descending sort's first k entries."""
    values, columns = torch.sort(scores, dim=-1, descending=True, stable=True)
    return values[..., :k], columns[..., :k]
