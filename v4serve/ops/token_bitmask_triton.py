"""Token bitmask on logits, Triton kernel (layout and math: token_bitmask_reference.py).

    logits[b, t] = -inf  unless  (bitmask[b, t // 32] >> (t % 32)) & 1

Layouts: logits [B, V] (row stride `stride_l`, unit along V), bitmask int32 [B, W] (row stride
`stride_m`), W >= ceil(V / 32). Grid (B, cdiv(V, BLOCK_V)); each program loads BLOCK_V / 32 words
(one per 32 tokens, the loads of a warp's lanes coalesce) and rewrites only the masked logits
(stores under the mask: an all-allowed block writes nothing). In place.
"""

import torch
import triton
import triton.language as tl

TOKEN_BITMASK_CONFIG = dict(BLOCK_V=2048, num_warps=4)


@triton.jit
def _token_bitmask_kernel(logits_ptr, mask_ptr, V, stride_l, stride_m, BLOCK_V: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    t = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    inside = t < V
    words = tl.load(mask_ptr + b * stride_m + t // 32, mask=inside, other=-1)
    blocked = ((words >> (t % 32)) & 1) == 0
    minus_inf = tl.full([BLOCK_V], float("-inf"), tl.float32).to(logits_ptr.dtype.element_ty)
    tl.store(logits_ptr + b * stride_l + t, minus_inf, mask=inside & blocked)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    B, V = logits.shape
    if B == 0 or V == 0:
        return logits
    cfg = TOKEN_BITMASK_CONFIG
    _token_bitmask_kernel[(B, triton.cdiv(V, cfg["BLOCK_V"]))](
        logits, bitmask, V, logits.stride(0), bitmask.stride(0), **cfg,
    )
    return logits
