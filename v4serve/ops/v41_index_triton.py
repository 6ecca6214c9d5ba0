"""Triton kernels of the DeepSeek-V4.1 indexer scores (math and contract: v41_index.py).

    l[s, h, t]  = bf16(q[s, h] . k[t])                     (one MMA, fp32 accumulation, one rounding)
    p[s, h, t]  = bf16(relu(l[s, h, t]) * w[s, h])          (product of two bf16: exact, one rounding)
    score[s, t] = bf16(sum_h p[s, h, t])                    (fp32 sum over the heads, one rounding)
    -inf where the column is past n_visible[s], a hole (key row -1) or not a candidate

Inputs: q [B, S, H, D] bf16 (fp4-rounded values, last dim contiguous), w [B, S, H] fp32 holding
bf16 values (scales folded in; fp32 so that no load is narrower than 4 bytes), key_rows [B, R]
int32 (the pool row of each of a sequence's compressed rows, -1 = hole), n_visible [B, S] int32,
k_pool either packed `fp4_e8m0_b32` rows or bf16 rows [N, D].
Output: bf16 [B, S, C] (every score is a bf16 value; half the bytes of fp32).

Packed key row (`fp4_e8m0_b32`, D = 128: 68 B = 17 little-endian int32 words, 4-byte aligned):
words 0 .. D/8 - 1 hold the e2m1 codes, element 8w + j in bits [4j, 4j + 4) of word w (the low
nibble of byte i is element 2i); word D/8 holds the D/32 ue8m0 scale bytes, the scale of channels
[32g, 32g + 32) in byte g. A code c (bit 3 the sign, m = c & 7 the magnitude index of
0, .5, 1, 1.5, 2, 3, 4, 6) decodes with integer operations and exact multiplies: the fp32 bits
(m << 22) | ((c & 8) << 28) are 2^-126 times the value (m < 2 lands in the subnormals: 0 and
0.5 * 2^-126; m >= 2 has exponent field m >> 1 and mantissa bit m & 1), so the value is that float
times 2^126, times the scale 2^(b - 127) (fp32 bits b << 23). Both multiplies are exact (powers of
two; the kernel needs a non-flush-to-zero multiply, which Triton emits), and so is the bf16 cast:
the MMA sees the bits torch's unpack gives.

Kernels, one contract (production: the tiles kernel for prefill in full mode, the streaming kernel of
v41_index_stream_triton.py for decode and candidate mode; the rows kernel is session 10's decode /
candidate kernel, kept as a `kernel="rows"` variant that bench/v41_index_configs.py times beside it):
* `_v41_scores_tiles_kernel` (full mode, many queries of one sequence: prefill): a program owns
  BLOCK_T key rows and BLOCK_S queries, decodes its keys once into shared memory, then for each
  head h = 0 .. H-1 runs one MMA q_h [BLOCK_S, D] x keys^T [D, BLOCK_T] (q_h streamed in by
  cp.async) and adds p to an fp32 accumulator: the heads are summed in index order. Key tiles
  wholly past every query's n_visible (the causal part) only write -inf.
* `_v41_scores_rows_kernel` (full-mode decode, and candidate mode, where every query has its own
  keys): a program owns one query and BLOCK_T of its columns, decodes those keys and runs one MMA
  [H, D] x [D, BLOCK_T] (every head in one tile); the heads are summed with tl.sum. In candidate
  mode column c of the output is slot c of the query's candidate list: key column
  cand[b, s, c // BLOCK] * BLOCK + c % BLOCK. A candidate-mode prefill chunk decodes the
  sequence's rows once (`_v41_decode_keys_kernel`) and runs this kernel over the bf16 rows.

Bits: l and p are the reference's bits whenever the fp32 dot is exact, which it is for fp4 x fp4
products unless a row's group scales span more than ~2^9 (the dot of one 32-channel group is an
integer multiple of its scale below 2^13). The head sum is the one step whose fp32 result depends
on the order: torch's order is its own (CPU: two sequential halves of 16, another order on CUDA);
where the orders round differently the scores differ by at most one bf16 ulp of the score plus
2 (H - 1) 2^-24 sum_h |p[s, h, t]| (both fp32 sums lie within (H - 1) 2^-24 sum_h |p| of the exact
sum), i.e. one ulp unless the heads cancel. tests/ops/test_v41_index_kernels.py checks both: the
exact bits where every sum is exact, the bound elsewhere.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.formats import row_format
from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch

# Tiles (sm_90, Triton 3.6-3.9): 4 warps keep 2 programs on an SM (232 registers, no spill), so one
# program's MMAs overlap the other's epilogue (Triton waits on each wgmma at once: a dot issued a head
# ahead did not overlap, and 8 warps, 149 registers, run as one program per SM whose two warpgroups
# meet at a barrier every head). BLOCK_T 128 halves the q traffic (BLOCK_S x H x D x 2 = 512 KB per
# program, from L2) of BLOCK_T 64. bench/kernel_configs.py times the alternatives.
# On mma.sync GPUs (sm_80, sm_89, sm_120) 4 warps need more than 255 registers (spills on sm_120): 8.
TILES_CONFIG = dict(BLOCK_S=64, BLOCK_T=128, num_warps=4, num_stages=3)
TILES_CONFIG_MMA_SYNC = dict(BLOCK_S=64, BLOCK_T=128, num_warps=8, num_stages=3)
# Rows: 64 columns per program for decode (more programs in flight for a latency-bound step); 128
# where 64 would give thousands of programs (a candidate-mode prefill chunk: the per-program q tile
# and its conversion to the MMA layout cost about a quarter of the instructions at 64).
ROWS_CONFIG = dict(BLOCK_T=64, num_warps=4, num_stages=1)
ROWS_CONFIG_MANY = dict(BLOCK_T=128, num_warps=4, num_stages=1)
ROWS_MANY_PROGRAMS = 4096
# "rows_predecoded" / "stream_predecoded" (variants): a candidate-mode prefill chunk decodes the
# sequence's rows once into a bf16 buffer (2 x 128 B per row, L2-resident at 128k rows) and gathers
# those with 16-byte loads instead of decoding each key once per query (session 10's production for
# candidate prefill, when the rows kernel's decode was ~2/3 of its instructions).
DECODE_ROWS = 32
ROWS_CONFIG_PREDECODED = dict(BLOCK_T=128, num_warps=8, num_stages=1)  # 4 warps spilled on sm_120 (3.8)


@triton.jit
def _e2m1_times(codes, shift: tl.constexpr, scale):
    """The code in bits [shift, shift + 4) of each word, decoded and scaled: fp32 (m << 22) | sign is
    2^-126 times the e2m1 value (m < 2 subnormal), then * 2^126 * scale (exact)."""
    nib = codes >> shift
    bits = ((nib & 7) << 22) | ((nib & 8) << 28)
    return (bits.to(tl.float32, bitcast=True) * 8.507059173023462e37) * scale


@triton.jit
def fp4_e8m0_b32_rows(words_ptr, rows, live, row_words, D: tl.constexpr):
    """Packed fp4_e8m0_b32 rows `rows` [R] (int32 words, row stride row_words) -> bf16 [R, D]; rows
    not `live` read as zeros. Each word's 8 codes are decoded in the word's own lanes and joined in
    registers, so no word is loaded twice (a [R, NW, 8] shift tensor replicated the word loads)."""
    NW: tl.constexpr = D // 8  # words of codes
    wc = tl.arange(0, NW)
    row_ptr = words_ptr + rows.to(tl.int64) * row_words
    codes = tl.load(row_ptr[:, None] + wc[None, :], mask=live[:, None], other=0)  # [R, NW]
    if NW <= 16:  # one scale word
        scale_word = tl.load(row_ptr + NW, mask=live, other=0)[:, None]
    else:
        scale_word = tl.load(row_ptr[:, None] + (NW + wc // 16)[None, :], mask=live[:, None], other=0)
    scale_byte = (scale_word >> (8 * ((wc // 4) % 4))[None, :]) & 0xFF  # [R, NW]: word w is in group w // 4
    scale = (scale_byte << 23).to(tl.float32, bitcast=True)  # 2^(b - 127), once per word
    # [R, NW, 2, 2, 2]: index (a, b, c) holds code 4a + 2b + c (tl.join adds the minor axis)
    even = tl.join(tl.join(_e2m1_times(codes, 0, scale), _e2m1_times(codes, 16, scale)),
                   tl.join(_e2m1_times(codes, 8, scale), _e2m1_times(codes, 24, scale)))  # [a, b]: code 4a + 2b
    odd = tl.join(tl.join(_e2m1_times(codes, 4, scale), _e2m1_times(codes, 20, scale)),
                  tl.join(_e2m1_times(codes, 12, scale), _e2m1_times(codes, 28, scale)))  # code 4a + 2b + 1
    return tl.reshape(tl.join(even, odd), (rows.shape[0], D)).to(tl.bfloat16)


@triton.jit
def _load_keys(k_ptr, rows, live, stride_k, D: tl.constexpr, PACKED: tl.constexpr):
    """Key rows [R] -> bf16 [R, D] (zeros where not live): packed words or bf16 rows (16-byte loads)."""
    if PACKED:
        keys = fp4_e8m0_b32_rows(k_ptr, rows, live, stride_k, D)
    else:
        d = tl.arange(0, D)
        keys = tl.load(k_ptr + rows.to(tl.int64)[:, None] * stride_k + d[None, :], mask=live[:, None], other=0.0)
    return keys


@triton.jit
def _weighted_relu(logits, w):
    """bf16(relu(bf16(logits)) * w) as fp32, w fp32 holding bf16 values, broadcastable to logits.
    relu before the rounding gives the same value (rounding is monotonic); the product of two bf16
    values is exact in fp32, so it is rounded once (sm_90 compiles it to a bf16x2 multiply)."""
    return (tl.maximum(logits, 0.0).to(tl.bfloat16).to(tl.float32) * w).to(tl.bfloat16).to(tl.float32)


@triton.jit
def _v41_scores_tiles_kernel(
    q_ptr, w_ptr, k_ptr, rows_ptr, n_visible_ptr, out_ptr,
    S, H, R,
    stride_qb, stride_qs, stride_qh, stride_wb, stride_ws, stride_k, stride_rb, stride_nb,
    stride_ob, stride_os,
    D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_T: tl.constexpr, PACKED: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
    t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    s = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    b = tl.program_id(2).to(tl.int64)
    n_visible = tl.load(n_visible_ptr + b * stride_nb + s, mask=s < S, other=0)
    out_ptrs = out_ptr + b * stride_ob + s.to(tl.int64)[:, None] * stride_os + t[None, :]
    out_mask = (s < S)[:, None] & (t < R)[None, :]
    if tl.program_id(0) * BLOCK_T < tl.max(n_visible, 0):
        rows = tl.load(rows_ptr + b * stride_rb + t, mask=t < R, other=-1)
        live = rows >= 0
        keys_t = tl.trans(_load_keys(k_ptr, rows, live, stride_k, D, PACKED))  # [D, BLOCK_T], decoded once
        d = tl.arange(0, D)
        q_ptrs = q_ptr + b * stride_qb + s.to(tl.int64)[:, None] * stride_qs + d[None, :]
        w_ptrs = w_ptr + b * stride_wb + s.to(tl.int64) * stride_ws
        acc = tl.zeros([BLOCK_S, BLOCK_T], dtype=tl.float32)
        for h in range(H):  # heads summed in index order
            q = tl.load(q_ptrs + h * stride_qh, mask=(s < S)[:, None], other=0.0)
            w = tl.load(w_ptrs + h, mask=s < S, other=0.0)  # fp32 holding a bf16 value
            acc += _weighted_relu(tl.dot(q, keys_t), w[:, None])
        valid = (t[None, :] < n_visible[:, None]) & live[None, :]
        tl.store(out_ptrs, tl.where(valid, acc, float("-inf")).to(tl.bfloat16), mask=out_mask)
    else:
        tl.store(out_ptrs, tl.full([BLOCK_S, BLOCK_T], float("-inf"), tl.float32).to(tl.bfloat16), mask=out_mask)


@triton.jit
def _v41_scores_rows_kernel(
    q_ptr, w_ptr, k_ptr, rows_ptr, n_visible_ptr, cand_ptr, out_ptr,
    H, R, C,
    stride_qb, stride_qs, stride_qh, stride_wb, stride_ws, stride_k, stride_rb, stride_nb,
    stride_cb, stride_cs, stride_ob, stride_os,
    D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, CAND_BLOCK: tl.constexpr,
    PACKED: tl.constexpr, CANDIDATES: tl.constexpr, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
    c = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)  # output columns (candidate slots)
    s = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    n_visible = tl.load(n_visible_ptr + b * stride_nb + s)
    out_ptrs = out_ptr + b * stride_ob + s * stride_os + c
    heads = tl.arange(0, BLOCK_H)  # every head (BLOCK_H >= H): q and w load beside the key chain
    d = tl.arange(0, D)
    q = tl.load(q_ptr + b * stride_qb + s * stride_qs + heads[:, None] * stride_qh + d[None, :],
                mask=(heads < H)[:, None], other=0.0)
    w = tl.load(w_ptr + b * stride_wb + s * stride_ws + heads, mask=heads < H, other=0.0)  # fp32, bf16 values
    if CANDIDATES:
        block = tl.load(cand_ptr + b * stride_cb + s * stride_cs + c // CAND_BLOCK, mask=c < C, other=-1)
        col = block * CAND_BLOCK + c % CAND_BLOCK
        listed = block >= 0
        nothing = tl.max((listed & (col < n_visible)).to(tl.int32), 0) == 0  # the list's -1 tail
    else:  # key_rows is read beside n_visible, not after it: two dependent loads to the keys, not three
        col = c
        listed = c < C
        nothing = False
    if nothing:  # nothing to score: -inf without touching a key
        tl.store(out_ptrs, tl.full([BLOCK_T], float("-inf"), tl.float32).to(tl.bfloat16), mask=c < C)
    else:
        rows = tl.load(rows_ptr + b * stride_rb + col, mask=listed & (col < R), other=-1)
        live = (rows >= 0) & (col < n_visible)
        keys = _load_keys(k_ptr, rows, live, stride_k, D, PACKED)  # [BLOCK_T, D]
        score = tl.sum(_weighted_relu(tl.dot(q, tl.trans(keys)), w[:, None]), 0)
        tl.store(out_ptrs, tl.where(live, score, float("-inf")).to(tl.bfloat16), mask=c < C)


@triton.jit
def _v41_decode_keys_kernel(words_ptr, rows_ptr, out_ptr, N, row_words, D: tl.constexpr, BLOCK_R: tl.constexpr):
    """out[i] = the bf16 values of packed key row rows[i] (zeros for a hole), i < N: the candidate
    mode's keys decoded once per step when every key would otherwise be decoded for many queries."""
    i = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    rows = tl.load(rows_ptr + i, mask=i < N, other=-1)
    keys = fp4_e8m0_b32_rows(words_ptr, rows, rows >= 0, row_words, D)
    d = tl.arange(0, D)
    tl.store(out_ptr + i.to(tl.int64)[:, None] * D + d[None, :], keys, mask=(i < N)[:, None])


def tiles_config(device: torch.device) -> dict:
    """The tiles kernel's production config for `device`: warpgroup MMAs (sm_90, sm_100) or mma.sync."""
    if compiled_on_cuda(device) and torch.cuda.get_device_capability(device)[0] in (9, 10):
        return TILES_CONFIG
    return TILES_CONFIG_MMA_SYNC


def _key_pool_words(k_pool: torch.Tensor, packed: bool, D: int) -> torch.Tensor:
    """The pool as the kernels index it: int32 words [N, row_bytes / 4] (packed) or bf16 [N, D]."""
    if packed:
        if k_pool.data_ptr() % 4 or k_pool.stride(0) % 4 or k_pool.stride(1) != 1:
            raise ValueError(f"packed k_pool must be 4-byte aligned with contiguous rows (int32 word loads): "
                             f"data_ptr % 4 = {k_pool.data_ptr() % 4}, row stride {k_pool.stride(0)} B")
        if k_pool.shape[0] == 0:  # every key a hole: a stand-in row (the stream kernel reads row 0 for holes)
            return torch.zeros(1, row_format("fp4_e8m0_b32").row_bytes(D) // 4, dtype=torch.int32, device=k_pool.device)
        return k_pool.view(torch.int32)
    if k_pool.shape[0] == 0:
        return torch.zeros(1, D, dtype=torch.bfloat16, device=k_pool.device)
    if k_pool.stride(1) != 1 or (k_pool.stride(0) * 2) % 16 or k_pool.data_ptr() % 16:
        raise ValueError("bf16 k_pool must be 16-byte aligned with contiguous rows (16-byte loads)")
    return k_pool


def v41_index_scores_triton(q, weights, k_pool, key_rows, n_visible, packed: bool, cand_blocks=None,
                            cand_block: int = 8, kernel: str = "auto", config: dict | None = None) -> torch.Tensor:
    """bf16 [B, S, C] scores (C = R in full mode, NB * cand_block in candidate mode). `kernel`:
    "tiles" (full mode, many queries per sequence), "stream" (v41_index_stream_triton.py: one query
    per program row, keys as the MMA's rows, loads a tile ahead), "stream_predecoded" (packed keys
    decoded once into bf16 rows, then "stream"), "rows" / "rows_predecoded" (the session-10 kernel:
    heads as the MMA's rows, one tile a program), or "auto" (tiles for full mode with S >= 16, else
    stream)."""
    B, S, H, D = q.shape
    R = key_rows.shape[1]
    candidates = cand_blocks is not None
    C = cand_blocks.shape[2] * cand_block if candidates else R
    out = torch.empty(B, S, C, dtype=torch.bfloat16, device=q.device)
    if out.numel() == 0:
        return out
    if q.stride(3) != 1:
        q = q.contiguous()
    pool = _key_pool_words(k_pool, packed, D)
    # the stream kernel reads these before its predecessor ends (early_chain): not if a copy is made here
    copies = not (key_rows.is_contiguous() and n_visible.is_contiguous()
                  and (not candidates or cand_blocks.is_contiguous()))
    key_rows, n_visible = key_rows.contiguous(), n_visible.contiguous()
    if candidates:
        cand_blocks = cand_blocks.contiguous()
    if kernel == "auto":  # the streaming kernel decodes each packed key per query (~24 instructions a word)
        kernel = "tiles" if not candidates and S >= 16 else "stream"
    if kernel in ("stream", "stream_predecoded"):
        from v4serve.ops.v41_index_stream_triton import v41_stream_scores

        return v41_stream_scores(q, weights, pool, key_rows, n_visible, packed, cand_blocks, cand_block, out,
                                 config, predecode=kernel == "stream_predecoded", early_chain=not copies)
    weights = weights.to(torch.bfloat16).float()  # bf16 values, read as 4-byte words
    if kernel == "rows_predecoded":  # decode the sequence's keys once, then gather bf16 rows
        if packed:
            flat, words = key_rows.flatten(), pool
            pool = torch.empty(flat.numel(), D, dtype=torch.bfloat16, device=q.device)
            _v41_decode_keys_kernel[(triton.cdiv(flat.numel(), DECODE_ROWS),)](
                words, flat, pool, flat.numel(), words.stride(0), D=D, BLOCK_R=DECODE_ROWS, num_warps=4)
            own = torch.arange(B * R, device=q.device, dtype=torch.int32).view(B, R)
            key_rows, packed = torch.where(key_rows >= 0, own, -1), False
        kernel, config = "rows", ROWS_CONFIG_PREDECODED if config is None else config
    common = (q.stride(0), q.stride(1), q.stride(2), weights.stride(0), weights.stride(1), pool.stride(0),
              key_rows.stride(0), n_visible.stride(0))
    if kernel == "tiles":
        if candidates:
            raise ValueError("the tiles kernel scores full mode only (candidate lists differ per query)")
        cfg = dict(tiles_config(q.device) if config is None else config)
        grid = (triton.cdiv(R, cfg["BLOCK_T"]), triton.cdiv(S, cfg["BLOCK_S"]), B)
        _v41_scores_tiles_kernel[grid](
            q, weights, pool, key_rows, n_visible, out, S, H, R, *common, out.stride(0), out.stride(1),
            D=D, PACKED=packed, **cfg, **pdl_launch(q),
        )
        return out
    if H > 128:
        raise ValueError(f"the rows kernel holds every head in one tile: H <= 128, got {H}")
    if config is None:
        many = triton.cdiv(C, ROWS_CONFIG["BLOCK_T"]) * S * B >= ROWS_MANY_PROGRAMS
        config = ROWS_CONFIG_MANY if many else ROWS_CONFIG
    cfg = dict(config)
    cand = cand_blocks if candidates else key_rows  # unused pointer in full mode
    grid = (triton.cdiv(C, cfg["BLOCK_T"]), S, B)
    _v41_scores_rows_kernel[grid](
        q, weights, pool, key_rows, n_visible, cand, out, H, R, C, *common,
        cand.stride(0), cand.stride(1) if candidates else 0, out.stride(0), out.stride(1),
        D=D, BLOCK_H=max(16, triton.next_power_of_2(H)), CAND_BLOCK=cand_block,
        PACKED=packed, CANDIDATES=candidates, **cfg, **pdl_launch(q),
    )
    return out
