"""Triton kernel of the indexer scores (math: indexer_reference.py).

    score[b, s, t] = sum_h w[b, s, h] * relu(q[b, s, h] . k_pool[key_rows[b, t]])   (fp32)
    -inf where t >= n_visible[b, s] or key_rows[b, t] == -1

Layouts: q [B, S, H, Dk] bf16 (last dim contiguous), w [B, S, H] fp32, k_pool [N, Dk] bf16
(16-byte aligned rows), key_rows [B, T] int32, n_visible [B, S] int32, out [B, S, T] fp32.
Grid (cdiv(T, BLOCK_T), S, B): a program gathers BLOCK_T keys once, then for each block of
BLOCK_H heads runs one bf16 tl.dot [BLOCK_H, Dk] x [Dk, BLOCK_T] with fp32 accumulation and
reduces relu * w over the heads in registers. Tiles wholly past n_visible (the causal half of a
prefill) skip the gather and the dot and only write -inf.

Packed keys (PACKED, row format fp4_e8m0_b32, Dk a power of two >= 32): k_pool is read as int32
words, row stride `stride_k` words (17 for Dk = 128: 16 words of e2m1 pairs, then 1 word of 4
ue8m0 bytes). Word w of a row holds elements 8w .. 8w + 7, element 8w + j in bits [4j, 4j + 4)
(the low nibble of byte i is element 2i, little-endian words). A nibble n decodes with integer
operations: magnitude m = n & 7 (the index of 0, .5, 1, 1.5, 2, 3, 4, 6) has the fp32 bits
(m << 22) + (126 << 23) for m >= 2, 126 << 23 (0.5) for m = 1 and 0 for m = 0, bit 3 is the
sign; the value is multiplied by 2^(b - 127) for the scale byte b of its 32-element group (byte
(w / 4) mod 4 of scale word NW + w / 16, NW = Dk / 8): exact (a non-ftz multiply; 0.5 * 2^-126
is an fp32 subnormal), and exact in bf16, so the dot sees the unpacked keys' bits.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.kv_quant_triton import _pow2

INDEX_CONFIG = dict(BLOCK_H=64, BLOCK_T=64, num_warps=4, num_stages=2)


@triton.jit
def load_fp4_words_keys(kw_ptr, rows, live, stride_k, BLOCK_D: tl.constexpr):
    """Packed fp4_e8m0_b32 key rows `rows` (int32 words, row stride stride_k words) as bf16 [len(rows), BLOCK_D]."""
    NW: tl.constexpr = BLOCK_D // 8
    wc = tl.arange(0, NW)
    row_words = kw_ptr + rows.to(tl.int64) * stride_k
    words = tl.load(row_words[:, None] + wc[None, :], mask=live[:, None], other=0)
    if NW <= 16:
        scale_word = tl.load(row_words + NW, mask=live, other=0x7F7F7F7F)[:, None]
    else:
        scale_word = tl.load(row_words[:, None] + (NW + wc // 16)[None, :], mask=live[:, None], other=0x7F7F7F7F)
    sb = (scale_word >> (8 * ((wc // 4) % 4))[None, :]) & 0xFF  # [R, NW]
    nib = (words[:, :, None] >> (4 * tl.arange(0, 8))[None, None, :]) & 0xF  # [R, NW, 8]
    mag = nib & 7
    bits = tl.where(mag >= 2, (mag << 22) + (126 << 23), tl.where(mag == 1, 126 << 23, 0)) | ((nib & 8) << 28)
    v = bits.to(tl.float32, bitcast=True) * _pow2(sb - 127)[:, :, None]
    return tl.reshape(v, (rows.shape[0], BLOCK_D)).to(tl.bfloat16)


@triton.jit
def _index_scores_kernel(
    q_ptr, w_ptr, k_ptr, rows_ptr, n_visible_ptr, out_ptr,
    H, Dk, T,
    stride_qb, stride_qs, stride_qh, stride_wb, stride_ws, stride_k, stride_rb, stride_nb,
    stride_ob, stride_os,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
    PACKED: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    keys = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    s = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    dims = tl.arange(0, BLOCK_D)
    n_visible = tl.load(n_visible_ptr + b * stride_nb + s)
    out_ptrs = out_ptr + b * stride_ob + s * stride_os + keys
    if tl.program_id(0) * BLOCK_T < n_visible:
        rows = tl.load(rows_ptr + b * stride_rb + keys, mask=keys < T, other=-1)
        live = (rows >= 0) & (keys < n_visible)
        if PACKED:
            k = load_fp4_words_keys(k_ptr, rows, live, stride_k, BLOCK_D)
        else:
            k = tl.load(k_ptr + rows.to(tl.int64)[:, None] * stride_k + dims[None, :],
                        mask=live[:, None] & (dims < Dk)[None, :], other=0.0)
        score = tl.zeros([BLOCK_T], dtype=tl.float32)
        for h0 in range(0, H, BLOCK_H):
            heads = h0 + tl.arange(0, BLOCK_H)
            q = tl.load(q_ptr + b * stride_qb + s * stride_qs + heads[:, None] * stride_qh + dims[None, :],
                        mask=(heads < H)[:, None] & (dims < Dk)[None, :], other=0.0)
            w = tl.load(w_ptr + b * stride_wb + s * stride_ws + heads, mask=heads < H, other=0.0)
            logits = tl.maximum(tl.dot(q, tl.trans(k)), 0.0)
            score += tl.sum(logits * w[:, None], 0)
        tl.store(out_ptrs, tl.where(live, score, float("-inf")), mask=keys < T)
    else:
        tl.store(out_ptrs, tl.full([BLOCK_T], float("-inf"), tl.float32), mask=keys < T)


def index_scores_triton(q, weights, k_pool, key_rows, n_visible, config=None, row_format=None) -> torch.Tensor:
    B, S, H, Dk = q.shape
    packed = row_format is not None
    if packed:
        if row_format.name != "fp4_e8m0_b32" or Dk < 32 or Dk & (Dk - 1):
            raise ValueError(f"packed keys: the kernel reads fp4_e8m0_b32 rows of a power-of-two Dk >= 32, got "
                             f"{row_format.name} with Dk = {Dk}")
        if k_pool.data_ptr() % 4 or k_pool.stride(0) % 4:
            raise ValueError(f"k_pool must be 4-byte aligned (int32 word loads): data_ptr % 4 = "
                             f"{k_pool.data_ptr() % 4}, row stride {k_pool.stride(0)} B")
        if k_pool.shape[0] == 0:
            k_pool = torch.zeros(1, row_format.row_bytes(Dk), dtype=torch.uint8, device=k_pool.device)
        k_pool = k_pool.view(torch.int32)  # [N, row_bytes / 4] words
    T = key_rows.shape[1]
    out = torch.empty(B, S, T, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out
    if q.stride(3) != 1:
        q = q.contiguous()
    if k_pool.stride(1) != 1:
        raise ValueError(f"k_pool rows must be contiguous, got channel stride {k_pool.stride(1)}")
    if k_pool.shape[0] == 0 and not packed:
        k_pool = torch.zeros(1, Dk, dtype=k_pool.dtype, device=k_pool.device)  # every key is a hole
    key_rows, n_visible = key_rows.contiguous(), n_visible.contiguous()
    weights = weights.float()
    cfg = dict(INDEX_CONFIG if config is None else config)
    cfg["BLOCK_H"] = min(cfg["BLOCK_H"], max(16, triton.next_power_of_2(H)))
    grid = (triton.cdiv(T, cfg["BLOCK_T"]), S, B)
    _index_scores_kernel[grid](
        q, weights, k_pool, key_rows, n_visible, out,
        H, Dk, T,
        q.stride(0), q.stride(1), q.stride(2), weights.stride(0), weights.stride(1), k_pool.stride(0),
        key_rows.stride(0), n_visible.stride(0), out.stride(0), out.stride(1),
        BLOCK_D=max(16, triton.next_power_of_2(Dk)), PACKED=packed, **cfg, **pdl_launch(q),
    )
    return out
