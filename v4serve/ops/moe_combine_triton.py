"""Triton kernel of the MoE combine (math: moe_combine_reference.py).

    out[t, d] = round(sum_i w[t, i] y[pos[t K + i], d])    (+ add[t, d], rounded again)

Layouts: y [P, D] (row stride `stride_y`, unit along D); pos [T K] int64 (or HAS_POS False: y
already in pick order, row t K + i); weights [T, K] fp32, contiguous; add [T, D] (row stride
`stride_a`) or absent; out [T, D] contiguous in y's dtype.
Grid (T, cdiv(D, BLOCK_D)): a program gathers its token's K rows of y (a slice of BLOCK_D columns
each), weights and sums them in fp32 in slot order. One launch replaces the gather of the sorted
weights, the product, the scatter back to pick order, the sum over K, the cast and the shared
expert's add.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

MOE_COMBINE_CONFIG = dict(BLOCK_D=512, num_warps=2)  # 8 bf16 (16 bytes) per thread and load


@triton.jit
def combine_columns(y_ptr, pos_ptr, w_ptr, add_ptr, out_ptr, t, d, ok, D, stride_y, stride_a,
                    K: tl.constexpr, HAS_POS: tl.constexpr, HAS_ADD: tl.constexpr, BLOCK_D: tl.constexpr,
                    Y_CACHE: tl.constexpr):
    """out[t, d] for one token t and a slice d of columns (mask ok): its K rows of y weighted and
    summed in fp32 in slot order, rounded, plus add[t, d] rounded again. Y_CACHE: the cache modifier
    of the y loads (".cg" where other programs of the same launch wrote y)."""
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for i in tl.static_range(K):
        if HAS_POS:
            row = tl.load(pos_ptr + t * K + i)
        else:
            row = t * K + i
        w = tl.load(w_ptr + t * K + i)
        acc += w * tl.load(y_ptr + row * stride_y + d, mask=ok, other=0.0, cache_modifier=Y_CACHE).to(tl.float32)
    out = acc.to(out_ptr.dtype.element_ty)
    if HAS_ADD:
        out = (out.to(tl.float32) + tl.load(add_ptr + t * stride_a + d, mask=ok, other=0.0).to(tl.float32))
        out = out.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + t * D + d, out, mask=ok)


@triton.jit
def _moe_combine_kernel(
    y_ptr, pos_ptr, w_ptr, add_ptr, out_ptr, D, stride_y, stride_a,
    K: tl.constexpr, HAS_ADD: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
    HAS_POS: tl.constexpr = True,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    combine_columns(y_ptr, pos_ptr, w_ptr, add_ptr, out_ptr, t, d, d < D, D, stride_y, stride_a, K, HAS_POS, HAS_ADD,
                    BLOCK_D, "")


def moe_combine_triton(y: torch.Tensor, pos: torch.Tensor | None, weights: torch.Tensor, add=None) -> torch.Tensor:
    T, k = weights.shape
    D = y.shape[1]
    y = y if y.stride(1) == 1 else y.contiguous()
    out = torch.empty(T, D, dtype=y.dtype, device=y.device)
    if T == 0:
        return out
    has_add = add is not None
    add = (add if add.stride(1) == 1 else add.contiguous()) if has_add else out
    cfg = MOE_COMBINE_CONFIG
    _moe_combine_kernel[(T, triton.cdiv(D, cfg["BLOCK_D"]))](
        y, y if pos is None else pos.contiguous(), weights.float().contiguous(), add, out, D, y.stride(0),
        add.stride(0), K=k, HAS_ADD=has_add, HAS_POS=pos is not None, **cfg, **pdl_launch(y),
    )
    return out
