"""Triton kernel of the indexer scores (math: indexer_reference.py).

    score[b, s, t] = sum_h w[b, s, h] * relu(q[b, s, h] . k_pool[key_rows[b, t]])   (fp32)
    w[b, s, h] = weights[b, s, h] * w_scale   (fp32; the indexer's constant head-weight scale, so
    the model needs no elementwise launch for it)
    -inf where t >= n_visible[b, s] or key_rows[b, t] == -1

Layouts: q [B, S, H, Dk] bf16 (last dim contiguous), w [B, S, H] fp32, key_rows [B, T] int32,
n_visible [B, S] int32, out [B, S, T] fp32. Keys: bf16 k_pool [N, Dk] (16-byte aligned rows,
gathered with 16-byte loads), or packed fp4_e8m0_b32 rows (Dk a power of two >= 32) read as int32
words, row stride `stride_k` words (17 for Dk = 128), decoded exactly to bf16 in registers
(fp4_words_triton.py).

Grid (cdiv(S, BLOCK_Q), splits, B). A program owns BLOCK_Q queries of one sequence and the key
blocks of one split (decode: many splits of a few blocks; prefill: one split, or a few when the
query blocks alone leave SMs idle); the last query blocks (most keys in a causal prefill) start
first. Its queries' Q is loaded once as the resident operand Q^T [Dk, BLOCK_Q * BLOCK_H] (column
= (query, head)); then for each block of BLOCK_T keys it gathers (and for packed rows decodes) the keys ONCE as a bf16 tile
[BLOCK_T, Dk] and computes

    logits = K @ Q^T                 [BLOCK_T, BLOCK_Q * BLOCK_H]   one bf16 tl.dot, fp32 accumulation
    score  = sum over each query's BLOCK_H columns of relu(logits) * w     [BLOCK_T, BLOCK_Q]

Keys are the dot's M dimension, so the head sum runs along the accumulator's columns, which a
thread holds in registers (wgmma / mma: 2 shuffles per row for the 4 lanes of a quad), not across
warps. A program walks only key blocks below its queries' largest visible count (the causal half of
a prefill costs nothing but its -inf stores) and writes -inf for the rest of its split.

Tiles (index_scores_config): prefill 4 queries per program on sm_90 (wgmma m64n256k16, two
programs per SM so one decodes while the other's dot runs), 2 elsewhere; decode one query, one
block of 64 keys per program (8192 keys: 128 programs; ONE_BLOCK: the key rows beside the counts,
then Q beside the keys: two memory latencies in a row, not four; a block past every visible key
loads neither, so a short context in a wide cache costs its -inf stores, not T / 64 loads of Q).
Prefill over packed keys (DECODE_FIRST, the production default for S > 1; a config without it
runs the fused fp4 kernel): the keys decoded once into a bf16 slab by _decode_keys_kernel, then this
kernel over bf16 keys with Q in the slab's column order (PAIR_ORDER). Decode reads the packed words.

Numerics: the dot sees exactly the reference's bf16 keys (packed rows decode exactly) and q; the
logits are fp32 sums of exact bf16 products, in the tensor core's order, and the head sum is an
fp32 sum in a different order than torch's einsum: equal to the reference within fp32 summation
order (integer-valued inputs give identical bits).
"""

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch, sm_count
from v4serve.ops.fp4_words_triton import decode_fp4_words, to_pair_order

# Prefill (S > 1) on sm_90: 4 queries x 64 heads per program, 64 keys per block (wgmma m64n256k16:
# the [64, 256] fp32 accumulator is half the register file of a 4-warp program; two programs per SM).
PREFILL_CONFIG = dict(BLOCK_Q=4, BLOCK_T=64, num_warps=4, num_stages=2)
# Elsewhere (mma.sync / tcgen05 accumulators spill at 4 queries): 2 queries per program.
PREFILL_CONFIG_Q2 = dict(BLOCK_Q=2, BLOCK_T=64, num_warps=4, num_stages=2)
# Decode (S == 1): one query, 64 keys per program (one block per split): 128 programs at 8192 keys.
DECODE_CONFIG = dict(BLOCK_Q=1, BLOCK_T=64, BLOCKS_PER_SPLIT=1, num_warps=4, num_stages=1)


@triton.jit
def load_fp4_words_keys(kw_ptr, rows, live, stride_k, BLOCK_D: tl.constexpr):
    """Packed fp4_e8m0_b32 key rows `rows` (int32 words, row stride stride_k words; rows * stride_k
    fits in int32) as bf16 [len(rows), BLOCK_D]; rows where `live` is false read as zeros."""
    NW: tl.constexpr = BLOCK_D // 8
    wc = tl.arange(0, NW)
    row_words = kw_ptr + (rows * stride_k)[:, None]
    words = tl.load(row_words + wc[None, :], mask=live[:, None], other=0)
    if NW <= 16:  # one scale word per row
        scale_words = tl.broadcast_to(tl.load(kw_ptr + rows * stride_k + NW, mask=live, other=0)[:, None], words.shape)
    else:
        scale_words = tl.load(row_words + (NW + wc // 16)[None, :], mask=live[:, None], other=0)
    return decode_fp4_words(words, scale_words, BLOCK_D)


@triton.jit
def _load_keys(k_ptr, rows, live, stride_k, Dk, BLOCK_D: tl.constexpr, PACKED: tl.constexpr):
    """bf16 [len(rows), BLOCK_D]: key rows gathered (16-byte loads) or packed rows decoded; zeros where not live."""
    if PACKED:
        k = load_fp4_words_keys(k_ptr, rows, live, stride_k, BLOCK_D)
    else:
        dims = tl.arange(0, BLOCK_D)
        k = tl.load(k_ptr + (rows * stride_k)[:, None] + dims[None, :], mask=live[:, None] & (dims < Dk)[None, :],
                    other=0.0)
    return k


@triton.jit
def _load_queries(q_ptr, w_ptr, b, q0, S, H, Dk, stride_qb, stride_qs, stride_qh, stride_wb, stride_ws, w_scale,
                  BLOCK_Q: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, PAIR_ORDER: tl.constexpr):
    """(Q^T bf16 [BLOCK_D, BLOCK_Q * BLOCK_H], w fp32 [BLOCK_Q * BLOCK_H]) of queries q0.. : column =
    (query, head), zeros past S / H / Dk; Q^T's rows in the decoded keys' column order when PAIR_ORDER.
    w is the loaded weight times w_scale, one fp32 multiply (the rounding of torch's `weights * w_scale`)."""
    cols = tl.arange(0, BLOCK_Q * BLOCK_H)
    col_s, col_h = q0 + cols // BLOCK_H, cols % BLOCK_H
    col_ok = (col_s < S) & (col_h < H)
    dims = tl.arange(0, BLOCK_D)
    q_t = tl.load(q_ptr + b * stride_qb + col_s[None, :] * stride_qs + col_h[None, :] * stride_qh + dims[:, None],
                  mask=col_ok[None, :] & (dims < Dk)[:, None], other=0.0)
    if PAIR_ORDER:
        q_t = to_pair_order(q_t, BLOCK_D)
    w = tl.load(w_ptr + b * stride_wb + col_s * stride_ws + col_h, mask=col_ok, other=0.0) * w_scale
    return q_t, w


@triton.jit
def _score_block(k, live, q_t, w, t0, n_visible, out_rows, out_ok, T,
                 BLOCK_T: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_H: tl.constexpr):
    """Scores of one block of keys k (from key t0) for the program's queries, stored (-inf where masked).
    Masks compare the block's offsets with counts relative to t0: 32-bit compares (the compiler
    widens a loop's key index to 64 bits for the addresses)."""
    offs = tl.arange(0, BLOCK_T)
    logits = tl.maximum(tl.dot(k, q_t), 0.0) * w[None, :]  # [BLOCK_T, BLOCK_Q * BLOCK_H]
    score = tl.sum(tl.reshape(logits, (BLOCK_T, BLOCK_Q, BLOCK_H)), 2)
    visible = live[:, None] & (offs[:, None] < (n_visible - t0)[None, :])
    tl.store(out_rows + t0 + offs[:, None], tl.where(visible, score, float("-inf")), mask=out_ok & (offs < T - t0)[:, None])


@triton.jit
def _index_scores_kernel(
    q_ptr, w_ptr, k_ptr, rows_ptr, n_visible_ptr, out_ptr,
    S, H, Dk, T, blocks_per_split, w_scale,
    stride_qb, stride_qs, stride_qh, stride_wb, stride_ws, stride_k, stride_rb, stride_nb,
    stride_ob, stride_os,
    BLOCK_Q: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
    PACKED: tl.constexpr = False, PAIR_ORDER: tl.constexpr = False, ONE_BLOCK: tl.constexpr = False,
    PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    # the last query blocks first: in a causal prefill they see the most keys (longest first)
    q0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_Q
    b = tl.program_id(2).to(tl.int64)
    queries = q0 + tl.arange(0, BLOCK_Q)
    n_visible = tl.load(n_visible_ptr + b * stride_nb + queries, mask=queries < S, other=0)
    t_begin = tl.program_id(1) * blocks_per_split * BLOCK_T
    t_end = tl.minimum(t_begin + blocks_per_split * BLOCK_T, T)
    t_live = tl.minimum(tl.max(n_visible, 0), t_end)  # keys from here on are masked for every query
    out_rows = out_ptr + b * stride_ob + queries[None, :].to(tl.int64) * stride_os
    out_ok = (queries < S)[None, :]
    offs = tl.arange(0, BLOCK_T)
    rows_at = rows_ptr + b * stride_rb
    if ONE_BLOCK:  # (decode) the key rows requested beside the counts, then the keys beside Q
        rows = tl.load(rows_at + t_begin + offs, mask=offs < t_end - t_begin, other=-1)
        if t_begin < t_live:  # a block past every visible key (a wide cache's tail) loads no Q and no keys
            q_t, w = _load_queries(q_ptr, w_ptr, b, q0, S, H, Dk, stride_qb, stride_qs, stride_qh, stride_wb,
                                   stride_ws, w_scale, BLOCK_Q, BLOCK_H, BLOCK_D, PACKED or PAIR_ORDER)
            k = _load_keys(k_ptr, rows, rows >= 0, stride_k, Dk, BLOCK_D, PACKED)
            _score_block(k, rows >= 0, q_t, w, t_begin, n_visible, out_rows, out_ok, T, BLOCK_T, BLOCK_Q, BLOCK_H)
    elif t_begin < t_live:
        q_t, w = _load_queries(q_ptr, w_ptr, b, q0, S, H, Dk, stride_qb, stride_qs, stride_qh, stride_wb, stride_ws,
                               w_scale, BLOCK_Q, BLOCK_H, BLOCK_D, PACKED or PAIR_ORDER)
        for t0 in range(t_begin, t_live, BLOCK_T):
            rows = tl.load(rows_at + t0 + offs, mask=offs < t_live - t0, other=-1)
            k = _load_keys(k_ptr, rows, rows >= 0, stride_k, Dk, BLOCK_D, PACKED)
            _score_block(k, rows >= 0, q_t, w, t0, n_visible, out_rows, out_ok, T, BLOCK_T, BLOCK_Q, BLOCK_H)
    t_dead = t_begin + tl.cdiv(tl.maximum(t_live - t_begin, 0), BLOCK_T) * BLOCK_T
    for t0 in range(t_dead, t_end, BLOCK_T):
        tl.store(out_rows + t0 + offs[:, None], tl.full([BLOCK_T, BLOCK_Q], float("-inf"), tl.float32),
                 mask=out_ok & (offs < t_end - t0)[:, None])


@triton.jit
def _decode_keys_kernel(k_ptr, rows_ptr, out_ptr, T, stride_k, stride_rb, stride_ot,
                        BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[b * T + t] = the decoded key of key_rows[b, t] (pair column order; zeros for a hole)."""
    keys = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    b = tl.program_id(1)
    rows = tl.load(rows_ptr + b * stride_rb + keys, mask=keys < T, other=-1)
    k = load_fp4_words_keys(k_ptr, rows, rows >= 0, stride_k, BLOCK_D)
    slab_rows = (b * T + keys).to(tl.int64)
    tl.store(out_ptr + slab_rows[:, None] * stride_ot + tl.arange(0, BLOCK_D)[None, :], k, mask=(keys < T)[:, None])


def _decoded_keys(k_words, key_rows, Dk):
    """Every referenced packed key decoded once: (bf16 [B * T, Dk] in pair column order, int32 [B, T]
    rows of it, -1 where key_rows has a hole)."""
    B, T = key_rows.shape
    slab = torch.empty(B * T, Dk, dtype=torch.bfloat16, device=key_rows.device)
    _decode_keys_kernel[(triton.cdiv(T, 64), B)](k_words, key_rows, slab, T, k_words.stride(0), key_rows.stride(0),
                                                  slab.stride(0), BLOCK_T=64, BLOCK_D=Dk, num_warps=4)
    positions = torch.arange(B * T, dtype=torch.int32, device=key_rows.device).view(B, T)
    return slab, torch.where(key_rows >= 0, positions, -1)


def _prefill_split(query_programs: int, key_blocks: int, device: torch.device) -> int:
    """Key blocks per program: all of them, unless the query blocks alone leave SMs idle (a short
    chunk over a long context): then the keys are split so that about two programs run per SM."""
    if not compiled_on_cuda(device):
        return key_blocks
    splits = min(key_blocks, triton.cdiv(2 * sm_count(device), query_programs))
    return triton.cdiv(key_blocks, max(1, splits))


def index_scores_config(S: int, device: torch.device) -> dict:
    """The production tiles: decode (one query per sequence) or prefill (4 queries a program on sm_90)."""
    if S == 1:
        return DECODE_CONFIG
    return PREFILL_CONFIG if compiled_on_cuda(device) and _arch_major(device) == 9 else PREFILL_CONFIG_Q2


@functools.lru_cache
def _arch_major(device: torch.device) -> int:
    return torch.cuda.get_device_capability(device)[0]


def index_scores_triton(q, weights, k_pool, key_rows, n_visible, config=None, row_format=None,
                        weight_scale=1.0) -> torch.Tensor:
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
    if k_pool.shape[0] * k_pool.stride(0) >= 2**31:
        raise ValueError(f"k_pool has {k_pool.shape[0]} rows of stride {k_pool.stride(0)}: the kernel's int32 row "
                         f"offsets reach at most 2^31 elements")
    key_rows, n_visible = key_rows.contiguous(), n_visible.contiguous()
    weights = weights.float()
    if weights.stride(2) != 1:
        weights = weights.contiguous()
    cfg = dict(index_scores_config(S, q.device) if config is None else config)
    # Prefill over packed keys decodes every key once, then runs the bf16 kernel (production since
    # the H200 run: the fused fp4 kernel took 900 µs at S2048@28672 against the bf16 kernel's 564).
    if cfg.pop("DECODE_FIRST", config is None and S > 1) and packed:
        k_pool, key_rows = _decoded_keys(k_pool, key_rows, Dk)
        packed, cfg["PAIR_ORDER"] = False, True
    block_q, block_t = cfg.pop("BLOCK_Q"), cfg["BLOCK_T"]
    key_blocks = triton.cdiv(T, block_t)
    query_programs = triton.cdiv(S, block_q) * B
    blocks_per_split = min(cfg.pop("BLOCKS_PER_SPLIT", None) or _prefill_split(query_programs, key_blocks, q.device),
                           key_blocks)
    grid = (triton.cdiv(S, block_q), triton.cdiv(key_blocks, blocks_per_split), B)
    cfg["ONE_BLOCK"] = blocks_per_split == 1
    _index_scores_kernel[grid](
        q, weights, k_pool, key_rows, n_visible, out,
        S, H, Dk, T, blocks_per_split, float(weight_scale),
        q.stride(0), q.stride(1), q.stride(2), weights.stride(0), weights.stride(1), k_pool.stride(0),
        key_rows.stride(0), n_visible.stride(0), out.stride(0), out.stride(1),
        BLOCK_Q=block_q, BLOCK_H=max(16, triton.next_power_of_2(H)), BLOCK_D=max(16, triton.next_power_of_2(Dk)),
        PACKED=packed, **cfg, **pdl_launch(q),
    )
    return out
