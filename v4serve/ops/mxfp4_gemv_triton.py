"""Triton GEMV kernel of the MXFP4 (W4A16) grouped matmul for few picks per expert (decode):
y[m] = x[rows[m]] @ W[g(m)]^T, optionally with the clamped SwiGLU of W's two row halves fused.
Same contract and layouts as mxfp4_grouped_matmul_triton.py; no tensor cores.

Why: at decode an expert has 1-4 picks, and the tensor-core kernel pads them to a 16-row dot: every
weight is decoded to bf16, written to shared memory in the dot's operand layout and read back,
per K step, for one useful row (~5.7 SASS instructions a weight, two barriers a step). Here each
weight is decoded once into registers and multiplied there by the picks' activations.

Math. W[e, n, k] = e2m1(code) * 2^(b - 127), b = scale[e, n, k // 32]. The decoder
(mxfp4_decode_triton.decode_word_*) turns a code into d = e2m1 * 2^-14 exactly, so

    y[m, n] = 2^14 * sum_blocks 2^(b_blk - 127) * (sum_{k in blk} d[n, k] * x[k])

Every product d * x is exact in fp32 (2 and 8 significant bits); the inner sums run over the 32
elements of one scale block (an FMA chain over the 8 elements of a word, then the 4 words of the
block), the block scale multiplies the partial sum once (one FMA a block), and the power-of-two
factors are exact: y differs from the reference (fp32 products, fp32 sums) only in the order of
the fp32 sums. Scale byte 0 (2^-127) and every byte up to 252 stay exact for single products.

Layouts (bytes). weight uint8 [E, N_W, K/2] read as int32 words [E, N_W, K/8]: word i of a row
holds elements 8i..8i+7, element 8i + q in nibble q (byte j: element 2j low nibble, 2j+1 high);
a row's K step is [BLOCK_K / 8] words, loaded 4 words (16 bytes = one 32-element scale block) per
thread. scale uint8 [E, N_W, K/32], one byte per block. x [T, K] bf16 / fp16 / fp32; y [M, N].

Schedule. Programs (blocks of PICKS picks of one expert, BLOCK_N output columns): the picks of
expert e form cdiv(size_e, PICKS) blocks (`group_block`: from `ends`, in registers, no host sync,
CUDA-graph safe); the grid is (cdiv(M, PICKS) + min(E, M) when PICKS > 1, M when PICKS == 1) x
cdiv(N, BLOCK_N). A program streams its BLOCK_N weight rows (with SWIGLU also the BLOCK_N up rows
N + n) along K, BLOCK_K elements a step, the next step's words and scales loaded before this step's
decode (a register double buffer: Triton does not software-pipeline loads that feed no dot),
decodes each word once, and runs one FMA chain per pick (1..PICKS, a static unrolled set of
accumulators, the decoded weights shared by all). Each thread loads the activations of its own
words (8-byte words of bf16 pairs, X_WORDS), so x needs no layout conversion; 4 rows a thread
share them. The per-block accumulators [BLOCK_N, BLOCK_K/32]
are summed across threads once at the end, then the SwiGLU epilogue (gate and up rounded to y's
dtype first, as the unfused path stores them) or a plain store. The grid has thousands of
programs at decode shapes (6 experts x 4096 rows / BLOCK_N), so no split-K.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch
from v4serve.ops.grouped_matmul_triton import group_block
from v4serve.ops.mxfp4_decode_triton import GEMV_UNIT_INV, decode_word_asm, decode_word_bits
from v4serve.ops.quant_decode_triton import ue8m0_to_f32
from v4serve.ops.swiglu_triton import clamped_swiglu_f32

@triton.jit
def _decode(words, DECODE_ASM: tl.constexpr):
    if DECODE_ASM:
        return decode_word_asm(words)
    return decode_word_bits(words)


@triton.jit
def _x_column(x_row, q: tl.constexpr, mask):
    return tl.load(x_row + q, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _bf16_pair(w):
    """int32 holding two bf16 (element 2j low, 2j+1 high) -> the two as fp32 (exact: bits moved)."""
    return (w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def _pick_row(rows_ptr, pick, valid, HAS_ROWS: tl.constexpr):
    """The pick's row of x (int64)."""
    if HAS_ROWS:
        return tl.load(rows_ptr + pick, mask=valid, other=0)
    return pick.to(tl.int64)


@triton.jit
def _pick_x(x_ptr, row, valid, stride_x, k0, K, X_WORDS: tl.constexpr, EVEN_K: tl.constexpr, KW: tl.constexpr):
    """The pick's activations of one K step as 8 fp32 [1, KW] tensors: x[row, k0 + 8i + q], q = 0..7,
    in the weight words' layout (each thread loads the activations of its own words). X_WORDS: two
    8-byte loads a word (bf16 x, 8-byte aligned rows), the bf16 bits moved into fp32s."""
    offs_x = k0 + 8 * tl.arange(0, KW)[None, :]
    mask = valid if EVEN_K else valid & (offs_x < K)
    if X_WORDS:
        x_words = x_ptr.to(tl.pointer_type(tl.int64)) + row * (stride_x // 4) + offs_x // 4
        lo = tl.load(x_words, mask=mask, other=0)
        hi = tl.load(x_words + 1, mask=mask, other=0)
        x0, x1 = _bf16_pair(lo.to(tl.int32))
        x2, x3 = _bf16_pair((lo >> 32).to(tl.int32))
        x4, x5 = _bf16_pair(hi.to(tl.int32))
        x6, x7 = _bf16_pair((hi >> 32).to(tl.int32))
        return x0, x1, x2, x3, x4, x5, x6, x7
    x_at = x_ptr + row * stride_x + offs_x
    return (_x_column(x_at, 0, mask), _x_column(x_at, 1, mask), _x_column(x_at, 2, mask),
            _x_column(x_at, 3, mask), _x_column(x_at, 4, mask), _x_column(x_at, 5, mask),
            _x_column(x_at, 6, mask), _x_column(x_at, 7, mask))


@triton.jit
def _block_sums(d, xs, KW: tl.constexpr, BLOCK_N: tl.constexpr):
    """[BLOCK_N, KW / 4]: per 32-element block, sum_k d[n, k] * x[k] (an FMA chain per word)."""
    part = d[0] * xs[0]
    part = tl.fma(d[1], xs[1], part)
    part = tl.fma(d[2], xs[2], part)
    part = tl.fma(d[3], xs[3], part)
    part = tl.fma(d[4], xs[4], part)
    part = tl.fma(d[5], xs[5], part)
    part = tl.fma(d[6], xs[6], part)
    part = tl.fma(d[7], xs[7], part)
    return tl.sum(tl.reshape(part, (BLOCK_N, KW // 4, 4)), axis=2)


@triton.jit
def _load_step(w_rows, s_rows, up_w, up_s, k0, mask_n, k_words, K_SCALES, SWIGLU: tl.constexpr,
               EVEN_K: tl.constexpr, KW: tl.constexpr):
    """One K step's weight words [BLOCK_N, KW] and block scales [BLOCK_N, KW / 4] (fp32), and with
    SWIGLU the up rows' (else the same tensors again); masked past K unless EVEN_K (then the
    caller keeps k0 inside K)."""
    offs_w = k0 // 8 + tl.arange(0, KW)
    offs_s = k0 // 32 + tl.arange(0, KW // 4)
    if EVEN_K:
        w_mask = mask_n[:, None]
        s_mask = mask_n[:, None]
    else:
        w_mask = mask_n[:, None] & (offs_w[None, :] < k_words)
        s_mask = mask_n[:, None] & (offs_s[None, :] < K_SCALES)
    words = tl.load(w_rows + offs_w[None, :], mask=w_mask, other=0)
    scale = ue8m0_to_f32(tl.load(s_rows + offs_s[None, :], mask=s_mask, other=127).to(tl.int32))
    if SWIGLU:
        words_up = tl.load(w_rows + up_w + offs_w[None, :], mask=w_mask, other=0)
        scale_up = ue8m0_to_f32(tl.load(s_rows + up_s + offs_s[None, :], mask=s_mask, other=127).to(tl.int32))
        return words, scale, words_up, scale_up
    return words, scale, words, scale


@triton.jit
def _accumulate(acc, d, xs, scale, KW: tl.constexpr, BLOCK_N: tl.constexpr):
    return tl.fma(_block_sums(d, xs, KW, BLOCK_N), scale, acc)


@triton.jit
def _store_pick(y_ptr, acc, acc_up, pick, valid, offs_n, mask_n, stride_y, limit, SWIGLU: tl.constexpr):
    dtype = y_ptr.dtype.element_ty
    out = tl.sum(acc, axis=1) * GEMV_UNIT_INV  # undo the decoder's unit (exact)
    if SWIGLU:  # gate and up rounded to y's dtype first, as the unfused matmul stores them
        up = tl.sum(acc_up, axis=1) * GEMV_UNIT_INV
        h = clamped_swiglu_f32(out.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), limit, dtype)
    else:
        h = out.to(dtype)
    tl.store(y_ptr + pick.to(tl.int64) * stride_y + offs_n, h, mask=valid & mask_n)


@triton.jit
def _mxfp4_gemv_kernel(
    x_ptr, w_ptr, s_ptr, rows_ptr, ends_ptr, y_ptr,
    N, K, K_SCALES, stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_y, limit,
    N_GROUPS: tl.constexpr, HAS_ROWS: tl.constexpr, X_WORDS: tl.constexpr, DECODE_ASM: tl.constexpr,
    SWIGLU: tl.constexpr, EVEN_K: tl.constexpr, PICKS: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
    PDL: tl.constexpr = False,
):
    """stride_we / stride_wn in int32 words (the weight rows are read as words), the rest in elements."""
    if PDL:
        gdc_wait()
    e, offs_m, mask_m = group_block(ends_ptr, tl.program_id(0), N_GROUPS, PICKS, BLOCK_E)
    if e >= N_GROUPS:
        return
    first = tl.min(offs_m, axis=0)
    n_valid = tl.sum(mask_m.to(tl.int32), axis=0)
    KW: tl.constexpr = BLOCK_K // 8
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = (w_ptr.to(tl.pointer_type(tl.int32)) + e.to(tl.int64) * stride_we
              + offs_n.to(tl.int64)[:, None] * stride_wn)
    s_rows = s_ptr + e.to(tl.int64) * stride_se + offs_n.to(tl.int64)[:, None] * stride_sn
    up_w = N * stride_wn  # SWIGLU: the up rows N..2N-1
    up_s = N * stride_sn
    k_words = K // 8
    row0 = _pick_row(rows_ptr, first, n_valid > 0, HAS_ROWS)
    row1 = _pick_row(rows_ptr, first + 1, n_valid > 1, HAS_ROWS)
    row2 = _pick_row(rows_ptr, first + 2, n_valid > 2, HAS_ROWS)
    row3 = _pick_row(rows_ptr, first + 3, n_valid > 3, HAS_ROWS)
    acc0 = tl.zeros((BLOCK_N, KW // 4), dtype=tl.float32)
    acc1 = tl.zeros_like(acc0)
    acc2 = tl.zeros_like(acc0)
    acc3 = tl.zeros_like(acc0)
    up0 = tl.zeros_like(acc0)
    up1 = tl.zeros_like(acc0)
    up2 = tl.zeros_like(acc0)
    up3 = tl.zeros_like(acc0)
    # a register double buffer: the next step's words and scales load while this step decodes
    # (EVEN_K: the prefetch after the last step re-reads the last step instead of masking)
    words, scale, words_up, scale_up = _load_step(w_rows, s_rows, up_w, up_s, 0, mask_n, k_words, K_SCALES,
                                                  SWIGLU, EVEN_K, KW)
    for k0 in range(0, K, BLOCK_K):
        k_next = tl.minimum(k0 + BLOCK_K, K - BLOCK_K) if EVEN_K else k0 + BLOCK_K
        next_words, next_scale, next_words_up, next_scale_up = _load_step(
            w_rows, s_rows, up_w, up_s, k_next, mask_n, k_words, K_SCALES, SWIGLU, EVEN_K, KW)
        d = _decode(words, DECODE_ASM)
        x0 = _pick_x(x_ptr, row0, n_valid > 0, stride_x, k0, K, X_WORDS, EVEN_K, KW)
        acc0 = _accumulate(acc0, d, x0, scale, KW, BLOCK_N)
        if PICKS > 1:
            x1 = _pick_x(x_ptr, row1, n_valid > 1, stride_x, k0, K, X_WORDS, EVEN_K, KW)
            acc1 = _accumulate(acc1, d, x1, scale, KW, BLOCK_N)
        if PICKS > 2:
            x2 = _pick_x(x_ptr, row2, n_valid > 2, stride_x, k0, K, X_WORDS, EVEN_K, KW)
            acc2 = _accumulate(acc2, d, x2, scale, KW, BLOCK_N)
            x3 = _pick_x(x_ptr, row3, n_valid > 3, stride_x, k0, K, X_WORDS, EVEN_K, KW)
            acc3 = _accumulate(acc3, d, x3, scale, KW, BLOCK_N)
        if SWIGLU:
            d_up = _decode(words_up, DECODE_ASM)
            up0 = _accumulate(up0, d_up, x0, scale_up, KW, BLOCK_N)
            if PICKS > 1:
                up1 = _accumulate(up1, d_up, x1, scale_up, KW, BLOCK_N)
            if PICKS > 2:
                up2 = _accumulate(up2, d_up, x2, scale_up, KW, BLOCK_N)
                up3 = _accumulate(up3, d_up, x3, scale_up, KW, BLOCK_N)
        words, scale, words_up, scale_up = next_words, next_scale, next_words_up, next_scale_up
    _store_pick(y_ptr, acc0, up0, first, n_valid > 0, offs_n, mask_n, stride_y, limit, SWIGLU)
    if PICKS > 1:
        _store_pick(y_ptr, acc1, up1, first + 1, n_valid > 1, offs_n, mask_n, stride_y, limit, SWIGLU)
    if PICKS > 2:
        _store_pick(y_ptr, acc2, up2, first + 2, n_valid > 2, offs_n, mask_n, stride_y, limit, SWIGLU)
        _store_pick(y_ptr, acc3, up3, first + 3, n_valid > 3, offs_n, mask_n, stride_y, limit, SWIGLU)


# Tiles: BLOCK_K 256 = 32 words a row step, 8 threads of 4 words (16 bytes, one scale block) each
# along K, so a warp spans 4 rows and 4 warps 16; BLOCK_N 64 gives each thread 4 rows of the same
# K columns (their activations converted once for 4 rows). With SWIGLU a program reads 2 x BLOCK_N
# rows (gate and up), so BLOCK_N is halved. At Flash decode (N 4096 / 2048 outputs, 6 experts) that
# is 384 programs a matmul, ~3 an SM, each with 8 KB of weight loads a step (two steps in flight).
# num_stages 1: Triton does not pipeline these loads (no dot), the kernel's own double buffer does
# (stages 3 compiles to the same SASS). BLOCK_K 512 (8 rows a thread, 4.5 instructions a weight
# instead of 4.8, 165-181 registers) is a bench variant.
# With 2 or 4 picks the accumulators and activations double: 64 rows take ~220 registers (2 CTAs an
# SM), 32 rows ~128 (4 CTAs), so the row tiles are halved (sm_90, Triton 3.6: 128 / 96 registers).
GEMV_CONFIG = dict(BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=1)
GEMV_SWIGLU_CONFIG = dict(BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=1)
GEMV_MULTI_CONFIG = dict(GEMV_CONFIG, BLOCK_N=32)
GEMV_MULTI_SWIGLU_CONFIG = dict(GEMV_SWIGLU_CONFIG, BLOCK_N=16)
PICKS_CHOICES = (1, 2, 4)


def gemv_config(picks: int, swiglu: bool) -> dict:
    """The production tiles for `picks` picks a program."""
    if picks == 1:
        return GEMV_SWIGLU_CONFIG if swiglu else GEMV_CONFIG
    return GEMV_MULTI_SWIGLU_CONFIG if swiglu else GEMV_MULTI_CONFIG


def gemv_picks(n_picks: int, n_experts: int) -> int | None:
    """Picks per GEMV program for a call of `n_picks` picks over `n_experts` experts (uniform
    routing in expectation; never read from the routing: no host sync), or None when the
    tensor-core kernel should run. With P picks a program decodes its weights once and runs P FMA
    chains; an expert with more picks takes more programs (its weights re-read, mostly from L2).
    Up to E/4 picks (c <= 10 tokens at top-6 of 256) nearly every expert has one pick: P = 1.
    Above that the tensor-core kernel runs, as measured on the H200 (session 11, Flash layer):
    P = 1 at c1 / c8 46.5 / 258 µs against 93 / 467 for the tensor-core kernel, but P = 2 at c64
    (1.5 E picks) 2204 µs against 2033, and a c8 speculative verify (192 picks, 0.75 E) 0.25 ms a
    layer slower with P = 2. P = 2 and 4 stay selectable (bench/moe_configs.py).
    Speculative verify batches (c x (k + 1) tokens: 16-32 at c8) take P = 1 up to 0.75 E picks
    (32 tokens at top-6 of 256): the tensor-core kernel measured 360 / 568 µs a launch there
    (c8 k = 1 / 3, session 13 profile), against an estimate of ~260 / ~520 µs for P = 1 (its c8 cost
    scaled by the picks; repeated experts come from L2). `kernel_configs 'moe flash verify'` times both."""
    if 4 * n_picks <= 3 * n_experts:
        return 1
    return None


def _x_words(x: torch.Tensor) -> bool:
    """bf16 activations read as 8-byte words: 8-byte aligned base and rows."""
    return x.dtype == torch.bfloat16 and x.data_ptr() % 8 == 0 and x.stride(0) % 4 == 0


def mxfp4_gemv_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, rows: torch.Tensor | None,
                      ends: torch.Tensor, n_picks: int, picks: int, config: dict | None = None,
                      swiglu_limit: float | None = None, decode: str | None = None) -> torch.Tensor:
    """`mxfp4_grouped_matmul_triton`'s contract with the GEMV kernel, `picks` (1, 2, 4) picks a
    program; `config`: BLOCK_N, BLOCK_K, num_warps, num_stages (default `gemv_config`); `decode`
    "asm" (the PTX word decoder, compiled CUDA only) or "bits" (default: asm on compiled CUDA)."""
    if picks not in PICKS_CHOICES:
        raise ValueError(f"picks must be one of {PICKS_CHOICES}, got {picks}")
    e, n_w, half_k = weight.shape
    k = 2 * half_k
    if k % 32 or weight.data_ptr() % 16 or weight.stride(1) % 16 or weight.stride(0) % 16:
        raise ValueError("the GEMV kernel reads weight rows as 16-byte words: K % 32 == 0 and 16-byte aligned rows")
    swiglu = swiglu_limit is not None
    n = n_w // 2 if swiglu else n_w
    cfg = config or gemv_config(picks, swiglu)
    decode = decode or ("asm" if compiled_on_cuda(x.device) else "bits")
    if decode not in ("asm", "bits"):
        raise ValueError(f"decode must be 'asm' or 'bits', got {decode!r}")
    y = torch.empty(n_picks, n, dtype=x.dtype, device=x.device)
    if n_picks == 0:
        return y
    blocks = n_picks if picks == 1 else triton.cdiv(n_picks, picks) + min(e, n_picks)
    grid = (blocks, triton.cdiv(n, cfg["BLOCK_N"]))
    _mxfp4_gemv_kernel[grid](
        x, weight, scale, rows if rows is not None else ends, ends, y, n, k, k // 32, x.stride(0),
        weight.stride(0) // 4, weight.stride(1) // 4, scale.stride(0), scale.stride(1), y.stride(0),
        float(swiglu_limit) if swiglu else 0.0,
        N_GROUPS=e, HAS_ROWS=rows is not None, X_WORDS=_x_words(x), DECODE_ASM=decode == "asm", SWIGLU=swiglu,
        EVEN_K=k % cfg["BLOCK_K"] == 0, PICKS=picks, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
        BLOCK_E=triton.next_power_of_2(e),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_launch(x),
    )
    return y
