"""Layer-ahead prefetch of offloaded experts (`EngineArgs.offload_prefetch`, off by default).

At layer L's MoE, the next MoE layer's router is applied to layer L's MoE input (pre-gating:
consecutive layers' normalised inputs differ little, so the next layer's picks are guessed; a
hash layer's picks depend only on the token and are exact). The offloaded experts guessed are
planned into layer L+1's slots and fetched on its side stream while layer L's experts and layer
L+1's attention compute (`ExpertOffload.prefetch`). Exactness does not depend on the guess: a
prefetch only fills slots (least recently used first); layer L+1's own plan fetches whatever is
still missing, and its passes read only the experts its real picks name.

Cost per linked layer: one router GEMV and routing op, a copy of the guessed picks into a
persistent buffer, the plan kernel and the four fetch launches (decode-sized steps only: a
prefill chunk fetches every offloaded expert anyway).
"""

from __future__ import annotations

import torch
from torch import nn


class LayerAheadPrefetch:
    """Called by MoE layer L with its input: guesses layer L+1's picks and prefetches them. A plain
    object (not a Module), so the next layer's router is not registered twice in the module tree."""

    def __init__(self, router: nn.Module, offload):
        self.router, self.offload = router, offload

    def __call__(self, x: torch.Tensor, token_ids: torch.Tensor, route_rows: torch.Tensor | None) -> None:
        experts, _ = self.router(x, token_ids, route_rows)
        self.offload.prefetch(experts)


def link_layer_ahead_prefetch(net: nn.Module) -> int:
    """Give every MoE layer whose next MoE layer has offloaded experts a prefetch of them; returns
    the number of links. (The decoder layers in order; the MTP layers are not linked.)"""
    from v4serve.model.moe import MoE

    layers = [m for m in net.model.layers]
    links = 0
    for here, there in zip(layers, layers[1:]):
        moe, nxt = here.mlp, there.mlp
        offload = getattr(nxt.experts, "offload", None)
        if isinstance(moe, MoE) and isinstance(nxt, MoE) and offload is not None:
            moe.prefetch_next = LayerAheadPrefetch(nxt.gate, offload)
            links += 1
    return links
