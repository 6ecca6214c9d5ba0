"""Triton GEMV kernel of the FP8 block-scaled linear for M = 1..8 rows (decode): no tensor cores.
Same contract as fp8_linear_triton.py (math in fp8_linear_reference.py); a `kernel="gemv"` choice
of ops/fp8_linear.py.

Why: at M = 1 the decode tiles of fp8_linear_triton.py pad the rows to a 16-row FP8 MMA and move
every weight tile through shared memory into the MMA operand layout, for one useful row; the
1-4 MB projections ran at 14-31% of the HBM floor (H200, docs/performance.md "Session 10"). Here
each weight byte is converted once in registers and multiplied there by the rows' activations,
as in the MXFP4 GEMV (mxfp4_gemv_triton.py).

Math. y[m, n] = sum_k A[m, k] * w[n, k] * s_w[n // BN, k // BK], w the e4m3 value of the weight
byte, A = x (weight-only, act_block None) or the official activation quantization
A[m, k] = q[m, k] * s_a[m, k // AB] (q e4m3 codes, s_a ue8m0 powers of two, computed first by
`act_quant_triton`, the production kernel's own launch). With G = min(BK, AB) (act mode) or BK
(weight-only), a thread's 16 consecutive k never straddle a G block (G >= 16, both powers of two),
so per (row m, weight row n, 16-element chunk c):

    part[m, n, c] = sum_{k in chunk c} a[m, k] * w[n, k]   (an FMA chain of 4 per word, 4 words added; fp32)
    acc[m, n, c] += part[m, n, c] * (s_w[n // BN, k_c // BK] * s_a[m, k_c // AB])   (one FMA)
    y[m, n]       = sum_c acc[m, n, c] (once, at the end; with split-K, then over the splits)

a = q (act mode: e4m3 x e4m3 products have 8 significant bits) or x in fp32 (weight-only: bf16 x
e4m3, 12 bits): every product is exact in fp32. The scales multiply partial sums, as the
production kernel's POST_SCALE and the reference fp8_gemm's per-block promotion do, so with
power-of-two scales y differs from the reference only in the order of the fp32 sums (fp32 weight
scales, V4-Flash-Base: the same products, rounded once more).

Byte layouts. weight e4m3 [N, K] row-major, read as int32 words [N, K / 4]: byte j of word i is
element 4i + j. A row's K step is BLOCK_K / 4 words; each thread loads 4 consecutive words (one
16-byte load: 16 elements of one chunk), so K % 16 == 0 and 16-byte aligned rows are required.
Activation codes e4m3 [M, K] (act mode) are read as the same words in the same layout: every thread
loads the 16 codes of its own chunk, one 16-byte load per row m. Weight-only x (bf16 / fp16 /
fp32) is loaded element-wise in that layout. Scales fp32: weight [ceil(N / BN), ceil(K / BK)]
(one load per chunk, shared across the tile's rows when BLOCK_N divides BN), activation
[M, ceil(K / AB)]. Output: y [M, N] in x's dtype, or fp32 partials [SPLIT, M, N] summed in split
order by fp8_linear_triton's `_split_k_sum_kernel`.

Conversion. CVT_ASM (sm_89+ compiled CUDA): per word two `cvt.rn.f16x2.e4m3x2` (exact: every e4m3
value, subnormals included, is an f16) and four `cvt.f32.f16`: 1.5 instructions an element.
Otherwise (the interpreter, sm_80) `e4m3_bits_to_f32` on each byte: integer ops, the same values.

Schedule. Program (n tile, split): BLOCK_N weight rows, K range [split * k_per_split, ...) in steps
of BLOCK_K. Tiles BLOCK_N 64 x BLOCK_K 128 over 4 warps: 8 threads of 16 bytes span a 128-byte row
step, a warp 4 rows, 4 warps 16, so each thread holds 4 rows of the same 16 columns: the activations
it converts serve 4 weight rows. The words and scales of PREFETCH (2) steps ahead load before this
step converts (a register ring; Triton pipelines only loads that feed a dot; at M = 1 the row's
activation codes too: X_AHEAD). ROWS = M (1..8) runs
one static set of accumulators [BLOCK_N, BLOCK_K / 16] per row, the converted weights shared by
all. split-K only when the N tiles are fewer than the SMs (Flash: every projection but wq_b).
No host syncs (CUDA-graph safe).
"""

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda, fp8_conversion_supported, pdl_launch
from v4serve.ops.fp8_linear_triton import SPLIT_K_SUM_BLOCK, _split_k_sum_kernel, act_quant_triton
from v4serve.ops.quant_decode_triton import e4m3_bits_to_f32

MAX_ROWS = 8
CHUNK = 16  # elements (bytes) of one thread's load: one partial sum
_CHUNK = tl.constexpr(CHUNK)

# $0..$3: elements 0..3 (bytes 0..3 of the word $4) as fp32. cvt.rn.f16x2.e4m3x2 takes the low
# byte of its 16-bit source to the low f16 of its result.
_E4M3_WORD_ASM = tl.constexpr(
    "{\n.reg .b16 lo, hi, h0, h1, h2, h3;\n.reg .b32 p01, p23;\n"
    "mov.b32 {lo, hi}, $4;\n"
    "cvt.rn.f16x2.e4m3x2 p01, lo;\n"
    "cvt.rn.f16x2.e4m3x2 p23, hi;\n"
    "mov.b32 {h0, h1}, p01;\n"
    "mov.b32 {h2, h3}, p23;\n"
    "cvt.f32.f16 $0, h0;\n"
    "cvt.f32.f16 $1, h1;\n"
    "cvt.f32.f16 $2, h2;\n"
    "cvt.f32.f16 $3, h3;\n"
    "}"
)


@triton.jit
def e4m3_word_asm(words):
    """int32 words (4 e4m3 bytes each) -> 4 fp32 tensors, element j = byte j (sm_89+ PTX)."""
    return tl.inline_asm_elementwise(
        asm=_E4M3_WORD_ASM, constraints="=r,=r,=r,=r,r", args=[words],
        dtype=(tl.float32,) * 4, is_pure=True, pack=1,
    )


@triton.jit
def e4m3_word_bits(words):
    """e4m3_word_asm with integer ops (any backend, the interpreter too)."""
    return (e4m3_bits_to_f32(words & 0xFF), e4m3_bits_to_f32((words >> 8) & 0xFF),
            e4m3_bits_to_f32((words >> 16) & 0xFF), e4m3_bits_to_f32((words >> 24) & 0xFF))


@triton.jit
def _e4m3_word(words, CVT_ASM: tl.constexpr):
    if CVT_ASM:
        return e4m3_word_asm(words)
    return e4m3_word_bits(words)


@triton.jit
def _load_weights(w_rows, ws_ptr, ws_rows, k0, mask_n, K, stride_ws, BK: tl.constexpr, EVEN_K: tl.constexpr,
                  SHARED_ROW_SCALE: tl.constexpr, KW: tl.constexpr, BLOCK_N: tl.constexpr):
    """One K step: weight words [BLOCK_N, KW] (int32) and the chunks' weight scales [BLOCK_N or 1, KW / 4]."""
    offs_w = k0 // 4 + tl.arange(0, KW)
    offs_c = k0 + _CHUNK * tl.arange(0, KW // 4)  # first element of each chunk
    if EVEN_K:
        words = tl.load(w_rows + offs_w[None, :], mask=mask_n[:, None], other=0)
    else:
        words = tl.load(w_rows + offs_w[None, :], mask=mask_n[:, None] & (offs_w[None, :] < K // 4), other=0)
    if SHARED_ROW_SCALE:
        s_w = tl.load(ws_ptr + ws_rows + offs_c // BK, mask=offs_c < K, other=0.0)[None, :]
    else:
        s_w = tl.load(ws_ptr + ws_rows[:, None] + (offs_c // BK)[None, :],
                      mask=mask_n[:, None] & (offs_c[None, :] < K), other=0.0)
    return words, s_w


@triton.jit
def _x_codes(x_ptr, xs_ptr, m, k0, K, stride_x, stride_xs, AB: tl.constexpr, EVEN_K: tl.constexpr, KW: tl.constexpr):
    """Row m's activation codes of one K step as int32 words [KW] (the weight words' layout) and
    the chunks' activation scales [KW / 4]."""
    offs_w = k0 // 4 + tl.arange(0, KW)
    row = x_ptr.to(tl.pointer_type(tl.int32)) + m * (stride_x // 4)
    if EVEN_K:
        words = tl.load(row + offs_w)
    else:
        words = tl.load(row + offs_w, mask=offs_w < K // 4, other=0)
    offs_c = k0 + _CHUNK * tl.arange(0, KW // 4)
    s_a = tl.load(xs_ptr + m * stride_xs + offs_c // AB, mask=offs_c < K, other=0.0)
    return words, s_a


@triton.jit
def _x_values(x_ptr, m, k0, K, stride_x, KW: tl.constexpr):
    """Weight-only: row m of x for one K step as 4 fp32 [1, KW]: x[m, k0 + 4i + j], j = 0..3."""
    offs_w = k0 // 4 + tl.arange(0, KW)
    mask = offs_w < K // 4
    at = x_ptr + m * stride_x + 4 * offs_w
    a0 = tl.load(at, mask=mask, other=0.0).to(tl.float32)[None, :]
    a1 = tl.load(at + 1, mask=mask, other=0.0).to(tl.float32)[None, :]
    a2 = tl.load(at + 2, mask=mask, other=0.0).to(tl.float32)[None, :]
    a3 = tl.load(at + 3, mask=mask, other=0.0).to(tl.float32)[None, :]
    return a0, a1, a2, a3


@triton.jit
def _load_step(w_rows, ws_ptr, ws_rows, x_ptr, xs_ptr, k0, mask_n, K, stride_ws, stride_x, stride_xs,
               BK: tl.constexpr, AB: tl.constexpr, EVEN_K: tl.constexpr, SHARED_ROW_SCALE: tl.constexpr,
               X_AHEAD: tl.constexpr, KW: tl.constexpr, BLOCK_N: tl.constexpr):
    """One ring slot: the step's weight words and scales, and with X_AHEAD row 0's activation codes
    and scales (else the weight tensors again, unused)."""
    words, s_w = _load_weights(w_rows, ws_ptr, ws_rows, k0, mask_n, K, stride_ws, BK, EVEN_K, SHARED_ROW_SCALE,
                               KW, BLOCK_N)
    if X_AHEAD:
        x_words, s_a = _x_codes(x_ptr, xs_ptr, 0, k0, K, stride_x, stride_xs, AB, EVEN_K, KW)
    else:
        x_words, s_a = words, s_w
    return words, s_w, x_words, s_a


@triton.jit
def _row_step(acc, d0, d1, d2, d3, s_w, x_ptr, xs_ptr, m, k0, K, stride_x, stride_xs, x_words, s_a,
              PRELOADED: tl.constexpr, AB: tl.constexpr, ACT_FP8: tl.constexpr, CVT_ASM: tl.constexpr,
              EVEN_K: tl.constexpr, KW: tl.constexpr, BLOCK_N: tl.constexpr):
    """acc [BLOCK_N, KW / 4] += per chunk (sum of 16 a * w) * s_w (* s_a) for row m; PRELOADED: row
    m's codes and scales are x_words / s_a (the ring's), else they are loaded here."""
    if ACT_FP8:
        if not PRELOADED:
            x_words, s_a = _x_codes(x_ptr, xs_ptr, m, k0, K, stride_x, stride_xs, AB, EVEN_K, KW)
        a0, a1, a2, a3 = _e4m3_word(x_words[None, :], CVT_ASM)
    else:
        a0, a1, a2, a3 = _x_values(x_ptr, m, k0, K, stride_x, KW)
    part = d0 * a0
    part = tl.fma(d1, a1, part)
    part = tl.fma(d2, a2, part)
    part = tl.fma(d3, a3, part)
    part = tl.sum(tl.reshape(part, (BLOCK_N, KW // 4, 4)), axis=2)
    if ACT_FP8:
        return tl.fma(part, s_w * s_a[None, :], acc)
    return tl.fma(part, s_w, acc)


@triton.jit
def _store_row(out_ptr, acc, m, offs_n, mask_n, stride_om):
    tl.store(out_ptr + m * stride_om + offs_n, tl.sum(acc, axis=1).to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _fp8_gemv_kernel(
    x_ptr, xs_ptr, w_ptr, ws_ptr, out_ptr, N, K, k_per_split, stride_x, stride_xs, stride_w, stride_ws,
    stride_os, stride_om,
    BN: tl.constexpr, BK: tl.constexpr, AB: tl.constexpr, ACT_FP8: tl.constexpr, CVT_ASM: tl.constexpr,
    ROWS: tl.constexpr, SHARED_ROW_SCALE: tl.constexpr, EVEN_K: tl.constexpr, PREFETCH: tl.constexpr,
    X_AHEAD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr = False,
):
    """Program (n tile, split). x_ptr: activation codes (ACT_FP8, read as int32 words; stride_x in
    bytes, a multiple of 4) or x; w_ptr: the weight bytes (stride_w in int32 words); out_ptr: y
    (one split) or the fp32 partials [split, M, N]; k_per_split a multiple of BLOCK_K; PREFETCH 1 or 2;
    X_AHEAD (act mode): row 0's codes and scales ride in the ring with the weights."""
    if PDL:
        gdc_wait()
    KW: tl.constexpr = BLOCK_K // 4
    split = tl.program_id(1)
    n0 = tl.program_id(0) * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = w_ptr.to(tl.pointer_type(tl.int32)) + offs_n.to(tl.int64)[:, None] * stride_w
    if SHARED_ROW_SCALE:
        ws_rows = (n0 // BN) * stride_ws
    else:
        ws_rows = (offs_n // BN) * stride_ws
    out_ptr += split.to(tl.int64) * stride_os
    k_begin = split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc0 = tl.zeros((BLOCK_N, KW // 4), dtype=tl.float32)
    acc1 = tl.zeros_like(acc0)
    acc2 = tl.zeros_like(acc0)
    acc3 = tl.zeros_like(acc0)
    acc4 = tl.zeros_like(acc0)
    acc5 = tl.zeros_like(acc0)
    acc6 = tl.zeros_like(acc0)
    acc7 = tl.zeros_like(acc0)
    # a register ring of PREFETCH steps ahead (EVEN_K: prefetches past the range re-read its last
    # step, unmasked; otherwise past K they are masked)
    words, s_w, x_words, s_a = _load_step(w_rows, ws_ptr, ws_rows, x_ptr, xs_ptr, k_begin, mask_n, K, stride_ws,
                                          stride_x, stride_xs, BK, AB, EVEN_K, SHARED_ROW_SCALE, X_AHEAD, KW, BLOCK_N)
    if PREFETCH > 1:
        k_second = tl.minimum(k_begin + BLOCK_K, k_end - BLOCK_K) if EVEN_K else k_begin + BLOCK_K
        words_2, s_w_2, x_words_2, s_a_2 = _load_step(w_rows, ws_ptr, ws_rows, x_ptr, xs_ptr, k_second, mask_n, K,
                                                      stride_ws, stride_x, stride_xs, BK, AB, EVEN_K,
                                                      SHARED_ROW_SCALE, X_AHEAD, KW, BLOCK_N)
    for k0 in range(k_begin, k_end, BLOCK_K):
        k_next = k0 + PREFETCH * BLOCK_K
        if EVEN_K:
            k_next = tl.minimum(k_next, k_end - BLOCK_K)
        words_n, s_w_n, x_words_n, s_a_n = _load_step(w_rows, ws_ptr, ws_rows, x_ptr, xs_ptr, k_next, mask_n, K,
                                                      stride_ws, stride_x, stride_xs, BK, AB, EVEN_K,
                                                      SHARED_ROW_SCALE, X_AHEAD, KW, BLOCK_N)
        d0, d1, d2, d3 = _e4m3_word(words, CVT_ASM)
        acc0 = _row_step(acc0, d0, d1, d2, d3, s_w, x_ptr, xs_ptr, 0, k0, K, stride_x, stride_xs, x_words, s_a,
                         X_AHEAD, AB, ACT_FP8, CVT_ASM, EVEN_K, KW, BLOCK_N)
        if ROWS > 1:
            acc1 = _row_step(acc1, d0, d1, d2, d3, s_w, x_ptr, xs_ptr, 1, k0, K, stride_x, stride_xs, x_words,
                             s_a, False, AB, ACT_FP8, CVT_ASM, EVEN_K, KW, BLOCK_N)
        if ROWS > 2:
            acc2 = _row_step(acc2, d0, d1, d2, d3, s_w, x_ptr, xs_ptr, 2, k0, K, stride_x, stride_xs, x_words,
                             s_a, False, AB, ACT_FP8, CVT_ASM, EVEN_K, KW, BLOCK_N)
        if ROWS > 3:
            acc3 = _row_step(acc3, d0, d1, d2, d3, s_w, x_ptr, xs_ptr, 3, k0, K, stride_x, stride_xs, x_words,
                             s_a, False, AB, ACT_FP8, CVT_ASM, EVEN_K, KW, BLOCK_N)
        if ROWS > 4:
            acc4 = _row_step(acc4, d0, d1, d2, d3, s_w, x_ptr, xs_ptr, 4, k0, K, stride_x, stride_xs, x_words,
                             s_a, False, AB, ACT_FP8, CVT_ASM, EVEN_K, KW, BLOCK_N)
        if ROWS > 5:
            acc5 = _row_step(acc5, d0, d1, d2, d3, s_w, x_ptr, xs_ptr, 5, k0, K, stride_x, stride_xs, x_words,
                             s_a, False, AB, ACT_FP8, CVT_ASM, EVEN_K, KW, BLOCK_N)
        if ROWS > 6:
            acc6 = _row_step(acc6, d0, d1, d2, d3, s_w, x_ptr, xs_ptr, 6, k0, K, stride_x, stride_xs, x_words,
                             s_a, False, AB, ACT_FP8, CVT_ASM, EVEN_K, KW, BLOCK_N)
        if ROWS > 7:
            acc7 = _row_step(acc7, d0, d1, d2, d3, s_w, x_ptr, xs_ptr, 7, k0, K, stride_x, stride_xs, x_words,
                             s_a, False, AB, ACT_FP8, CVT_ASM, EVEN_K, KW, BLOCK_N)
        if PREFETCH > 1:
            words, s_w, x_words, s_a = words_2, s_w_2, x_words_2, s_a_2
            words_2, s_w_2, x_words_2, s_a_2 = words_n, s_w_n, x_words_n, s_a_n
        else:
            words, s_w, x_words, s_a = words_n, s_w_n, x_words_n, s_a_n
    _store_row(out_ptr, acc0, 0, offs_n, mask_n, stride_om)
    if ROWS > 1:
        _store_row(out_ptr, acc1, 1, offs_n, mask_n, stride_om)
    if ROWS > 2:
        _store_row(out_ptr, acc2, 2, offs_n, mask_n, stride_om)
    if ROWS > 3:
        _store_row(out_ptr, acc3, 3, offs_n, mask_n, stride_om)
    if ROWS > 4:
        _store_row(out_ptr, acc4, 4, offs_n, mask_n, stride_om)
    if ROWS > 5:
        _store_row(out_ptr, acc5, 5, offs_n, mask_n, stride_om)
    if ROWS > 6:
        _store_row(out_ptr, acc6, 6, offs_n, mask_n, stride_om)
    if ROWS > 7:
        _store_row(out_ptr, acc7, 7, offs_n, mask_n, stride_om)


# Tiles (see the module docstring): 64 rows x 128 bytes a step over 4 warps, 4 rows a thread, for
# every M: each row of x converted per thread serves 4 weight rows (SASS of the sm_90 loop, Triton
# 3.6, per weight byte: 4.4 instructions at M1 (282 a step, 102 registers; 3.9 with PREFETCH 1:
# the ring costs 34-43 MOVs a step), 6.2 at M2, 9.8 at M4, 16.9 at M8 (183 registers); 32 rows:
# 12.4 at M4, 21.6 at M8). num_stages 1: no dot; the kernel's own register ring keeps PREFETCH
# steps (8 KB each) in flight per program (Triton pipelines only loads that feed a dot); at M1
# (X_AHEAD) row 0's codes and scales ride in the ring too, so no L2 round trip per step is exposed.
GEMV_CONFIG = dict(BLOCK_N=64, BLOCK_K=128, PREFETCH=2, X_AHEAD=True, num_warps=4, num_stages=1)
# split-K only when the N tiles are fewer than the SMs (wq_a / wkv / shared_w1 / wo_b / shared_w2 at
# 64 rows: 8-64 tiles), then up to this many programs per SM (wq_a: 16 tiles x 32 one-step splits;
# wo_b: 64 x 8 splits of 8 steps). wq_b (512 tiles) runs without the sum kernel's launch.
GEMV_PROGRAMS_PER_SM = 4


@functools.lru_cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def gemv_split_k(n_tiles: int, k_steps: int, device: torch.device) -> int:
    """K splits: 1 when the N tiles fill every SM (or in the interpreter), else enough to reach
    GEMV_PROGRAMS_PER_SM programs an SM."""
    if not compiled_on_cuda(device):
        return 1
    sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    if n_tiles >= sms:
        return 1
    return max(1, min(k_steps, triton.cdiv(GEMV_PROGRAMS_PER_SM * sms, n_tiles)))


def fp8_gemv_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int],
                    act_block: int | None, config: dict | None = None, split_k: int | None = None,
                    cvt: str | None = None) -> torch.Tensor:
    """y [M, N] for x [M, K], M <= MAX_ROWS (fp8_linear_triton's contract). `config` (BLOCK_N,
    BLOCK_K, PREFETCH (1 or 2 steps), num_warps, num_stages) and `split_k` override the defaults (tests, benchmarks); `cvt`
    "asm" (hardware e4m3 conversion, sm_89+ compiled CUDA) or "bits" (default: asm where supported)."""
    m, k = x.shape
    n = weight.shape[0]
    bn, bk = block
    if not 1 <= m <= MAX_ROWS:
        raise ValueError(f"the FP8 GEMV takes 1..{MAX_ROWS} rows, got M={m}")
    if k % CHUNK or weight.stride(-1) != 1 or weight.stride(0) % CHUNK or weight.data_ptr() % 16:
        raise ValueError("the FP8 GEMV reads weight rows as 16-byte words: K % 16 == 0 and 16-byte aligned rows")
    if x.stride(-1) != 1:
        raise ValueError("x must have a unit stride along K")
    group = bk if act_block is None else min(bk, act_block)
    if bk & (bk - 1) or group < CHUNK or (act_block is not None and act_block & (act_block - 1)):
        raise ValueError(f"the FP8 GEMV needs power-of-two blocks along K of at least {CHUNK}, got "
                         f"block={list(block)}, act_block={act_block}")
    cfg = config or GEMV_CONFIG
    cvt = cvt or ("asm" if fp8_conversion_supported(x.device) else "bits")
    if cvt not in ("asm", "bits"):
        raise ValueError(f"cvt must be 'asm' or 'bits', got {cvt!r}")
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if n == 0:
        return y
    if act_block is None:
        a, a_scale, stride_a = x, scale, x.stride(0)  # (a_scale is not read in weight-only mode)
    else:
        codes, a_scale = act_quant_triton(x, act_block)
        a, stride_a = codes.view(torch.uint8), codes.stride(0)  # rows of K bytes: 16-byte aligned
    block_k = cfg["BLOCK_K"]
    n_tiles = triton.cdiv(n, cfg["BLOCK_N"])
    k_steps = triton.cdiv(k, block_k)
    splits = split_k or gemv_split_k(n_tiles, k_steps, x.device)
    k_per_split = triton.cdiv(k_steps, splits) * block_k
    splits = triton.cdiv(k, k_per_split)
    out = y if splits == 1 else torch.empty(splits, m, n, dtype=torch.float32, device=x.device)
    pdl = pdl_launch(x)
    _fp8_gemv_kernel[(n_tiles, splits)](
        a, a_scale, weight.view(torch.uint8), scale, out, n, k, k_per_split, stride_a, a_scale.stride(0),
        weight.stride(0) // 4, scale.stride(0), out.stride(0) if splits > 1 else 0, out.stride(-2),
        BN=bn, BK=bk, AB=act_block or 1, ACT_FP8=act_block is not None, CVT_ASM=cvt == "asm", ROWS=m,
        SHARED_ROW_SCALE=bn % cfg["BLOCK_N"] == 0, EVEN_K=k % block_k == 0, PREFETCH=cfg.get("PREFETCH", 2),
        X_AHEAD=act_block is not None and m == 1 and cfg.get("X_AHEAD", True),
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=block_k, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl)
    if splits > 1:
        _split_k_sum_kernel[(triton.cdiv(m * n, SPLIT_K_SUM_BLOCK),)](
            out, y, m * n, SPLIT_K=splits, BLOCK=SPLIT_K_SUM_BLOCK, **pdl)
    return y
