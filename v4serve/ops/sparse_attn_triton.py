"""Triton kernels of paged sparse attention (math: sparse_attn_reference.py).

Layouts: q [T, H, D] bf16 (T = B * M query tokens), win_pool / cmp_pool [N, D] bf16 with one
shared row stride, both 16-byte aligned (pointer and row stride; asserted by the wrapper),
idx [T, C] int32 (columns < n_window -> win_pool, the rest -> cmp_pool, -1 = hole),
counts [T] int32 (live compressed columns, read on the device), sink [H] fp32.

One kernel, `_sparse_attn_kernel`, serves both phases. A program owns one query token, BLOCK_H
heads and one range of columns. It walks the range BLOCK_T columns at a time: gathers the
[BLOCK_T, D] KV tile once (MQA: every head of the token shares it; the per-column base pointer is
tl.where(is_window, win_ptr, cmp_ptr) under tl.multiple_of(.., 16) so the gather stays 16-byte
loads), S = Q K^T and O += P V run as bf16 tl.dot with fp32 accumulation, online softmax in
base 2 with the running max starting at the sink.

- prefill (M > 1): grid (T, cdiv(H, BLOCK_H), 1); the program covers all columns and writes
  O / (l + 2^(sink - m)) in bf16.
- decode (M == 1): grid (T, cdiv(H, BLOCK_H), n_splits); split s covers columns
  [s * COLS_PER_SPLIT, (s + 1) * COLS_PER_SPLIT) and writes its unnormalised (acc, m, l) in fp32;
  `_sparse_attn_merge_kernel` (grid (T, H)) combines the splits and the sink.
"""

import torch
import triton
import triton.language as tl

from v4serve.ops._dispatch import check_16_byte_aligned

# Production tiles (H200 sweeps, docs/performance.md). Prefill: all 64 heads of a token share each
# gathered [64, 512] KV tile. Decode: 16 heads per program; splits of 32 columns while the step
# has at most 1024 (token, column) pairs (B1 r4: 80 programs for 640 columns), 64 beyond.
PREFILL_CONFIG = dict(BLOCK_H=64, BLOCK_T=64, num_warps=8, num_stages=1)
DECODE_CONFIG_SMALL = dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=32, num_warps=4, num_stages=2)
DECODE_CONFIG_LARGE = dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=64, num_warps=4, num_stages=2)
SMALL_DECODE_PAIRS = 1024


def decode_config(n_tokens: int, n_columns: int) -> dict:
    """The production decode tiles for `n_tokens` query tokens (B at M = 1) over `n_columns` columns."""
    return DECODE_CONFIG_SMALL if n_tokens * n_columns <= SMALL_DECODE_PAIRS else DECODE_CONFIG_LARGE
LOG2E = 1.4426950408889634


@triton.jit
def _sparse_attn_kernel(
    q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, m_ptr, l_ptr,
    H, D, C, n_window, cols_per_split, qk_scale_log2,
    stride_qt, stride_qh, stride_pool, stride_it,
    stride_ot, stride_os, stride_oh, stride_mt, stride_ms,
    HAS_COUNTS: tl.constexpr, SPLIT: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    split = tl.program_id(2)
    dims = tl.arange(0, BLOCK_D)
    head_ok, dim_ok = heads < H, dims < D

    q = tl.load(q_ptr + tok * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                mask=head_ok[:, None] & dim_ok[None, :], other=0.0)
    sink = tl.load(sink_ptr + heads, mask=head_ok, other=0.0) * 1.4426950408889634

    hi = C
    if HAS_COUNTS:
        hi = tl.minimum(hi, n_window + tl.maximum(tl.load(counts_ptr + tok), 0))
    lo = split * cols_per_split
    hi = tl.minimum(hi, lo + cols_per_split)

    m_i = sink
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_T):
        cols = start + tl.arange(0, BLOCK_T)
        rows = tl.load(idx_ptr + tok * stride_it + cols, mask=cols < hi, other=-1)
        live = rows >= 0
        # NOTE: the hint keeps the gather at 16-byte loads (Triton >= 3.8 loses the alignment of a select).
        base = tl.multiple_of(tl.where(cols < n_window, win_ptr, cmp_ptr), 16)
        kv = tl.load(base[:, None] + rows.to(tl.int64)[:, None] * stride_pool + dims[None, :],
                     mask=live[:, None] & dim_ok[None, :], other=0.0)
        s = tl.dot(q, tl.trans(kv)) * qk_scale_log2
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)
        m_i = m_new

    out_offs = tok * stride_ot + split * stride_os + heads[:, None] * stride_oh + dims[None, :]
    out_mask = head_ok[:, None] & dim_ok[None, :]
    if SPLIT:
        tl.store(out_ptr + out_offs, acc, mask=out_mask)
        tl.store(m_ptr + tok * stride_mt + split * stride_ms + heads, m_i, mask=head_ok)
        tl.store(l_ptr + tok * stride_mt + split * stride_ms + heads, l_i, mask=head_ok)
    else:
        l_i = l_i + tl.exp2(sink - m_i)
        tl.store(out_ptr + out_offs, (acc / l_i[:, None]).to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _sparse_attn_merge_kernel(
    part_ptr, m_ptr, l_ptr, sink_ptr, out_ptr,
    H, D, n_splits,
    stride_pt, stride_ps, stride_ph, stride_mt, stride_ms, stride_ot, stride_oh,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    split_ok = splits < n_splits
    m_s = tl.load(m_ptr + tok * stride_mt + splits * stride_ms + head, mask=split_ok, other=float("-inf"))
    l_s = tl.load(l_ptr + tok * stride_mt + splits * stride_ms + head, mask=split_ok, other=0.0)
    sink = tl.load(sink_ptr + head) * 1.4426950408889634
    m = tl.maximum(tl.max(m_s, 0), sink)
    w = tl.exp2(m_s - m)
    denom = tl.sum(l_s * w, 0) + tl.exp2(sink - m)
    part = tl.load(part_ptr + tok * stride_pt + splits[:, None] * stride_ps + head * stride_ph + dims[None, :],
                   mask=split_ok[:, None] & (dims < D)[None, :], other=0.0)
    out = tl.sum(part * w[:, None], 0) / denom
    tl.store(out_ptr + tok * stride_ot + head * stride_oh + dims, out.to(out_ptr.dtype.element_ty), mask=dims < D)


def sparse_attn_paged_triton(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts=None, tile_config=None):
    """Launch the kernels; q [B, M, H, D] and both pools bf16. tile_config defaults to the production one
    (PREFILL_CONFIG when M > 1, decode_config(B, C) when M == 1)."""
    B, M, H, D = q.shape
    C = idx.shape[2]
    check_16_byte_aligned("win_pool", win_pool)
    check_16_byte_aligned("cmp_pool", cmp_pool)
    if win_pool.stride(0) != cmp_pool.stride(0):
        raise ValueError(f"win_pool and cmp_pool must share a row stride, got {win_pool.stride(0)} and {cmp_pool.stride(0)}")
    # An empty pool still needs a valid, aligned pointer: every column into it is a hole.
    win = win_pool if win_pool.shape[0] else cmp_pool
    cmp = cmp_pool if cmp_pool.shape[0] else win
    T = B * M
    qt = q.reshape(T, H, D)
    if qt.stride(2) != 1:
        qt = qt.contiguous()
    it = idx.reshape(T, C)
    if it.stride(1) != 1:
        it = it.contiguous()
    ct = it if counts is None else counts.reshape(T)
    sink = sink.float().contiguous()
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    if T == 0:
        return out.reshape(B, M, H, D)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    qk_scale_log2 = float(scale) * LOG2E
    common = (win, cmp, it, ct, sink)
    if M > 1:
        cfg = dict(PREFILL_CONFIG if tile_config is None else tile_config)
        grid = (T, triton.cdiv(H, cfg["BLOCK_H"]), 1)
        _sparse_attn_kernel[grid](
            qt, *common, out, out, out,
            H, D, C, n_window, max(C, 1), qk_scale_log2,
            qt.stride(0), qt.stride(1), win.stride(0), it.stride(0),
            out.stride(0), 0, out.stride(1), 0, 0,
            HAS_COUNTS=counts is not None, SPLIT=False, BLOCK_D=BLOCK_D, **cfg,
        )
        return out.reshape(B, M, H, D)
    cfg = dict(decode_config(T, C) if tile_config is None else tile_config)
    cols_per_split = cfg.pop("COLS_PER_SPLIT")
    n_splits = max(1, triton.cdiv(C, cols_per_split))
    part = torch.empty(T, n_splits, H, D, dtype=torch.float32, device=q.device)
    m_part = torch.empty(T, n_splits, H, dtype=torch.float32, device=q.device)
    l_part = torch.empty_like(m_part)
    grid = (T, triton.cdiv(H, cfg["BLOCK_H"]), n_splits)
    _sparse_attn_kernel[grid](
        qt, *common, part, m_part, l_part,
        H, D, C, n_window, cols_per_split, qk_scale_log2,
        qt.stride(0), qt.stride(1), win.stride(0), it.stride(0),
        part.stride(0), part.stride(1), part.stride(2), m_part.stride(0), m_part.stride(1),
        HAS_COUNTS=counts is not None, SPLIT=True, BLOCK_D=BLOCK_D, **cfg,
    )
    _sparse_attn_merge_kernel[(T, H)](
        part, m_part, l_part, sink, out,
        H, D, n_splits,
        part.stride(0), part.stride(1), part.stride(2), m_part.stride(0), m_part.stride(1),
        out.stride(0), out.stride(1),
        BLOCK_S=triton.next_power_of_2(n_splits), BLOCK_D=BLOCK_D, num_warps=4,
    )
    return out.reshape(B, M, H, D)

