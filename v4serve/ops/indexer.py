"""Lightning indexer of DeepSeek-V4: scores and top-k (scores: math in indexer_reference.py, kernel
in indexer_triton.py, bf16 q and keys on CUDA run the kernel; top-k: index_topk_reference.py and
index_topk_triton.py, the kernel under the TOPK_KERNEL_ON_CUDA rule)."""

import torch
import torch.nn.functional as F

from v4serve.formats import row_format as _row_format
from v4serve.ops._dispatch import use_triton
from v4serve.ops.kv_pack import check_pool
from v4serve.ops.index_topk_reference import index_topk_reference
from v4serve.ops.index_topk_triton import index_topk_triton
from v4serve.ops.indexer_reference import index_scores_reference
from v4serve.ops.indexer_triton import index_scores_triton


def index_scores(q, weights, k_pool, key_rows, n_visible, row_format=None, impl="auto",
                 weight_scale: float = 1.0) -> torch.Tensor:
    """fp32 [B, S, T]: sum_h w[b,s,h] * relu(q[b,s,h] . k_pool[key_rows[b,t]]), -inf where masked,
    w = weights * weight_scale (one fp32 multiply, in the kernel on CUDA: no launch of its own).

    q [B, S, H, Dk]; weights [B, S, H] fp32; k_pool [N, Dk];
    key_rows [B, T] int32 (-1 = hole); n_visible [B, S] int32 (keys t >= n_visible are masked).
    row_format None / "bf16": k_pool holds values; "fp4_e8m0_b32": k_pool is uint8 [N, >= 68] packed
    keys (v4serve/formats.py), read by the kernel as 17 int32 words per row and decoded in registers.
    """
    B, S, H, Dk = q.shape
    fmt = None if row_format is None else _row_format(row_format)
    if fmt is not None and not fmt.packed:
        fmt = None
    if weights.shape != (B, S, H):
        raise ValueError(f"weights must be [{B}, {S}, {H}], got {tuple(weights.shape)}")
    if fmt is not None:
        check_pool("k_pool", k_pool, fmt, Dk)
    elif k_pool.dim() != 2 or k_pool.shape[1] != Dk:
        raise ValueError(f"k_pool must be [N, {Dk}], got {tuple(k_pool.shape)}")
    if key_rows.dtype != torch.int32 or key_rows.dim() != 2 or key_rows.shape[0] != B:
        raise ValueError(f"key_rows must be int32 [{B}, T], got {key_rows.dtype} {tuple(key_rows.shape)}")
    if n_visible.dtype != torch.int32 or n_visible.shape != (B, S):
        raise ValueError(f"n_visible must be int32 [{B}, {S}], got {n_visible.dtype} {tuple(n_visible.shape)}")
    if fmt is not None:
        if use_triton(impl, q, weights, k_pool, key_rows, n_visible) and (q.dtype == torch.bfloat16 or impl == "triton"):
            if q.dtype != torch.bfloat16:
                raise ValueError(f"the Triton kernel takes bf16 q, got {q.dtype}")
            return index_scores_triton(q, weights, k_pool, key_rows, n_visible, row_format=fmt,
                                       weight_scale=weight_scale)
        return index_scores_reference(q, weights, k_pool, key_rows, n_visible, fmt, weight_scale)
    bf16 = q.dtype == k_pool.dtype == torch.bfloat16
    if use_triton(impl, q, weights, k_pool, key_rows, n_visible) and (bf16 or impl == "triton"):
        if not bf16:
            raise ValueError(f"the Triton kernel takes bf16 q and k_pool, got {q.dtype} and {k_pool.dtype}")
        return index_scores_triton(q, weights, k_pool, key_rows, n_visible, weight_scale=weight_scale)
    return index_scores_reference(q, weights, k_pool, key_rows, n_visible, weight_scale=weight_scale)


# The production rule for impl="auto" on CUDA: the Triton top-k (index_topk_triton.py) or torch.sort.
# The kernel, measured on the H200 (session 16, `kernel_configs 'index topk'`, µs, kernel vs
# torch.sort): k 512 T 1024 7.35 vs 20.27, T 2048 13.45 vs 20.89, T 8192 33.5 vs 48.4-80.8,
# T 32768 41.8-50.4 vs 49.3-133; k 1024 T 2048 17.5 vs 20.8, T 32768 B4 63.2 vs 73.4 (B1: 63.2 vs
# 49.2, the one shape torch.sort wins).
TOPK_KERNEL_ON_CUDA = True


def _topk_on_device(impl: str, scores: torch.Tensor) -> bool:
    """The Triton top-k: impl="triton", or "auto" on CUDA under TOPK_KERNEL_ON_CUDA."""
    return use_triton(impl, scores) and (impl == "triton" or TOPK_KERNEL_ON_CUDA) and scores.dtype == torch.float32


def sorted_top(scores: torch.Tensor, k: int, impl: str = "auto",
               n_live: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k <= T largest scores [..., k], largest first, and their columns (int64, the sort's index
    dtype, ready to index with). Equal scores go to the lower column, so the pick does not depend on
    T or the backend (random weights make exact ties common: a key whose every head has
    relu(q.k) = 0 scores 0). -inf scores (masked keys) come last, unmarked. The Triton kernel picks
    exactly these columns in this order (a radix select and a sort of the k picks, no host sync).
    n_live: int32 [...], where row b is known to score -inf from column n_live[b] on (a decode
    step's visible rows): the kernel then works on a row's live prefix only (the same picks)."""
    if _topk_on_device(impl, scores):
        return index_topk_triton(scores, k, n_live=n_live)
    return index_topk_reference(scores, k)


def select_topk(scores: torch.Tensor, k: int, impl: str = "auto") -> torch.Tensor:
    """int64 [..., k]: the columns of `sorted_top`, -1 where the pick is -inf or k > T."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    live = min(k, scores.shape[-1])
    if live == 0:
        return torch.full((*scores.shape[:-1], k), -1, dtype=torch.int64, device=scores.device)
    if _topk_on_device(impl, scores):
        picked = index_topk_triton(scores, live, mark_masked=True, write_values=False)[1]
    else:
        values, columns = index_topk_reference(scores, live)
        picked = torch.where(torch.isneginf(values), -1, columns)
    return F.pad(picked, (0, k - live), value=-1) if live < k else picked
