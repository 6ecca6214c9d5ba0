"""Triton kernels of paged sparse attention (math: sparse_attn_reference.py).

Layouts. q [T, H, D] bf16 (T = B * M query tokens, row-major, unit stride along D);
win_pool / cmp_pool [N, D] bf16 sharing one row stride, both 16-byte aligned (pointer and row
stride, asserted by the wrapper); idx [T, C] int32, C = n_window + K (column c < n_window names a
win_pool row, the rest cmp_pool rows, -1 = hole); counts [T] int32 (live compressed columns, read
on the device: columns >= n_window + counts[t] are skipped); sink [H] fp32; out [T, H, D] bf16.

Math, per token t and head h, in base 2 (qk_scale_log2 = scale * log2 e, sink2 = sink * log2 e):
    s_c = qk_scale_log2 * q[t, h] . kv_c      over the live columns c (KV = the gathered row: MQA)
    m   = max(sink2, max_c s_c)
    o   = sum_c 2^(s_c - m) kv_c / (sum_c 2^(s_c - m) + 2^(sink2 - m))
The running max starts at the sink, so a token whose columns are all holes gets exactly 0.

One kernel, `_sparse_attn_kernel`, serves both phases. A program owns one token, BLOCK_H heads
and one range of columns, and walks the range BLOCK_T columns at a time: it gathers the
[BLOCK_T, D] KV tile once for its heads (the per-column base pointer is
tl.where(is_window, win_ptr, cmp_ptr) under tl.multiple_of(.., 16), so the gather stays 16-byte
loads), runs S = Q K^T and acc += P V as bf16 tl.dot with fp32 accumulation, and keeps the online
softmax state (m [BLOCK_H], l [BLOCK_H], acc [BLOCK_H, D]) in registers.

Over packed fp8 rows (PACKED, issue 17) the program gathers the packed bytes of its tile (e4m3
codes and the bf16 rope tail as 16-byte loads, the ue8m0 scales as the int32 words holding them)
and dequantizes them in registers (kv_pack_triton.load_packed; exact, so the tile holds the
unpacked rows' values). Split-K decode does it once per [BLOCK_T, D] tile and runs both dots on
it, like the bf16 kernel: the same values into the same dots as the bf16 kernel at the same tiles
over the unpacked rows. On the GPU the dequantized tile passes an opaque bf16 boundary
(sparse_attn_tiles.bf16_operand_boundary, PK_BF16_OPERAND) so that its mma operands take the
bf16 kernel's layout (kWidth 2) and k order; without it (the interpreter, tile config
BF16_OPERAND False) Triton lays them out with kWidth 4, which permutes the k order inside each
mma.sync (equal bits where every sum is exact; otherwise a few outputs one bf16 ulp apart,
session 9's H200 test: relative 3e-7 to 5.5e-5) and costs ~230 register moves a thread per
tile. Tiles that set QK_SLICE launch `_sparse_attn_sliced_kernel` instead, the same
program with S = Q K^T computed as a chain of dots over QK_SLICE-wide slices of the head dim
(sparse_attn_tiles.sliced_scores: each K slice gathered and dequantized on its own, the Q slice
re-read from L1; P V still takes the whole dequantized tile): the packed prefill tiles, and
session 9's decode tiles (1.5x the bf16 kernel's time at B1 on the H200; in their TTGIR each
tile is four slice steps that each wait for their gather before dequantizing, then the whole tile
gathered and dequantized again). The chain is not one dot's accumulation
order on the tensor cores: on the H200 its output differs from the unsliced kernel's by a relative
7e-5 (prefill tiles) and 3e-7 (split-K decode), rounding only. Production *prefill* over packed
rows does not dequantize per (query, row) pair (each row is read by many queries: 8x the bf16
kernel's time on the H200): it unpacks every referenced row once into a small bf16 pool
(kv_compact.py: no host sync, so eager and captured steps alike) and runs the bf16 prefill kernels,
with the bits of the bf16 kernel over every row unpacked. The sliced kernel still serves prefill
tiles given explicitly.

The production prefill on sm_90 (Triton 3.6, D = 512) is instead the warp-specialised Gluon
kernel of sparse_attn_gluon.py (1.2-1.6x faster at the PR shapes, same output bits), and decode
steps of 2 or more tokens run the two-pass kernels of sparse_attn_two_pass.py (bf16 P between a
scores and a values launch instead of fp32 split partials); the wrapper below dispatches on the
tile config's KERNEL ("tl", "ws", "two_pass", or "unpack": packed rows unpacked per column first,
sparse_attn_unpacked_decode.py).

- prefill (M > 1): grid (T, cdiv(H, BLOCK_H), 1); the program covers every column and writes
  acc / (l + 2^(sink2 - m)) in bf16. sm_90: BLOCK_H 64, so one [64, 512] fp32 accumulator per
  token fills the register file (one program per SM).
- decode (M == 1): grid (T, cdiv(H, BLOCK_H), n_splits); split s covers columns
  [s * w, (s + 1) * w), w = COLS_PER_SPLIT, or WIDE_COLS_PER_SPLIT for a token with more than
  WIDE_FROM live columns (n_window + counts: the width is chosen on the device). With one split the
  program writes the output like prefill. Otherwise split s stores its unnormalised state in fp32
  (a split past its token's live columns, other than split 0, loads and stores nothing):
      part [T, n_splits, H, D] = acc_s,   m_part, l_part [T, n_splits, H] = m_s, l_s
  and `_sparse_attn_merge_kernel` (grid (T, H), one head of one token per program, launched with
  programmatic dependent launch on sm_90+) combines the splits below the token's live bound with
  the sink:
      m = max(sink2, max_s m_s),  w_s = 2^(m_s - m),
      o = sum_s w_s acc_s / (sum_s w_s l_s + 2^(sink2 - m)).
  MERGE "fused" instead lets the last split program of each (token, head block) merge (an int32
  ticket per (token, head block), atomic acq_rel, reset to 0 by the merging program).

Measured on the H200 and not adopted (sweeps of v4serve/bench/kernel_configs.py): decode splits
of 96 or 128 columns (96: -0.5 µs at r4/r128 B8, within about twice the noise); partials
normalised by l and stored in bf16, at 16, 32 or 64 heads per program (slower at every shape,
+0.1 µs at r0 B1 to +7 µs at r4 B8: the split kernel went from 160 to 201 registers); prefill
with 16 warps, BLOCK_T 32 or 128, and a persistent program walking a flat (token, tile) loop that
re-reads Q per tile (1.2-4x slower). Session 4 (docs/performance.md item 9): programs that split
the output dims (each computes the full scores, accumulates 128 or 256 dims; 4 warps so two fit
an SM), the next tile's gather issued into registers before this tile's dots, a lazy rescale
(running max kept until it grows by 8; spills the prefill tile), and bf16 partials: all slower.
Nsight Compute puts both phases at 2 warps per scheduler issuing once every 3.5 (prefill) to 4
(decode) cycles: latency-bound chains, half of the decode loop's instructions gather addressing.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from v4serve.ops._dispatch import (
    check_16_byte_aligned, compiled_on_cuda, fp8_conversion_supported, pdl_supported, sm_count, triton_at_least)
from v4serve.ops.sparse_attn_gluon import WS_HEAD_DIM, sparse_attn_ws
from v4serve.ops.kv_compact import unpack_referenced_rows
from v4serve.ops.kv_pack_triton import packed_constexprs
from v4serve.ops.sparse_attn_tiles import (
    bf16_operand_boundary, column_bound, gather_kv_tile, gather_packed_kv_tile, sliced_scores, split_width)
from v4serve.ops.sparse_attn_two_pass import sparse_attn_two_pass
from v4serve.ops.sparse_attn_unpacked_decode import unpack_columns

# Production tiles (H200 sweeps, docs/performance.md). Prefill: all 64 heads of a token share each
# gathered [64, 512] KV tile. Single-token decode (steps of more tokens take the two-pass kernels
# below): 16 heads per program; splits of 32 columns up to SMALL_DECODE_PAIRS columns (B1 r4: 80
# programs for 640 columns), 64 once a token has more live (DECODE_CONFIG_LIVE: V4-Pro's 1152); the
# merge kernel is launched with programmatic dependent launch (PDL, sm_90+) so its launch overlaps
# the split kernel. Also available by tile_config, and measured slower on the H200
# (a program's serial tile steps cost ~2 µs each): COLS_PER_SPLIT None (one program per
# (token, head block) walks every column) and MERGE "fused" (the last split program merges).
# Prefill tiles per GPU architecture (compute capability major*10 + minor). sm_90 (the one timed)
# gathers each [64, 512] KV tile once for all 64 heads, 1 stage in its 227 KB of shared memory;
# Triton 3.9's ptxas (13.4) spills that tile's accumulator (288 B, codegen check), so under 3.9
# sm_90 takes 32 heads. Elsewhere 32 heads x 64 columns with 8 warps fit the registers without
# spilling under Triton 3.6, 3.8 and 3.9 (sm_80: 2 stages in 100 KB); sm_86 / sm_89 / sm_120
# (99 KB) take 32 x 32. Only sm_90 under 3.6 has been timed (docs/performance.md).
PREFILL_CONFIG = dict(BLOCK_H=64, BLOCK_T=64, num_warps=8, num_stages=1)
PREFILL_CONFIG_H32 = dict(BLOCK_H=32, BLOCK_T=64, num_warps=8, num_stages=1)
PREFILL_CONFIG_SMALL_SMEM = dict(BLOCK_H=32, BLOCK_T=32, num_warps=8, num_stages=1)
PREFILL_CONFIGS = {
    80: dict(PREFILL_CONFIG_H32, num_stages=2),
    90: PREFILL_CONFIG_H32 if triton_at_least(3, 9) else PREFILL_CONFIG,
    100: PREFILL_CONFIG_H32,
    120: PREFILL_CONFIG_SMALL_SMEM,
}
DECODE_CONFIG_SMALL = dict(BLOCK_H=16, BLOCK_T=32, COLS_PER_SPLIT=32, MERGE="kernel", PDL=True, num_warps=4,
                           num_stages=2)
DECODE_CONFIG_LARGE = dict(DECODE_CONFIG_SMALL, COLS_PER_SPLIT=64)
# Over packed rows (issue 17) the Gluon kernel is not used (it reads bf16 rows only). Prefill tiles
# compute S = Q K^T as a chain of dots over head-dim slices (QK_SLICE: the sliced kernel, each K
# slice gathered and dequantized on its own; only P V takes the whole dequantized tile); the slice
# is one scale block (64 channels), or wider where a slice of 64 would give each thread fewer than
# 16 code bytes to load. At 64 columns x 32 heads the sliced kernel sits at 255 registers under
# 3.6 and spills 16-80 B under Triton 3.8 / 3.9, so packed prefill takes 32 x 32 tiles on every
# arch (230-240 registers); production prefill over packed rows unpacks the rows first anyway.
def _sliced(cfg: dict) -> dict:
    return dict(cfg, QK_SLICE=max(64, 16 * 32 * cfg["num_warps"] // cfg["BLOCK_T"]))


PREFILL_CONFIG_PACKED = _sliced(PREFILL_CONFIG_SMALL_SMEM)
PREFILL_CONFIGS_PACKED = {arch: _sliced(dict(PREFILL_CONFIG_SMALL_SMEM, num_stages=cfg["num_stages"]))
                          for arch, cfg in PREFILL_CONFIGS.items()}
# Split-K decode over packed rows (session 10): the bf16 tiles (16 heads x 32-column splits), each
# [32, 512] tile gathered once (codes, rope tail and scale words: one round of 16- and 4-byte
# loads), dequantized once in registers (the hardware e4m3 conversion on sm_89+, load_packed's
# FP8_CVT) and used by both dots, as the bf16 kernel uses its gathered tile (S is one dot; the
# same values as the bf16 kernel's at these tiles, up to the k order inside the mma). 4 warps since
# session 13 (the H200 sweep at r4 B1: 6.79 µs against 7.02 / 7.20 at 8 warps and 6.75 over bf16
# rows, once the bf16 operand boundary removed the register moves; 235-242 registers, 49 KB of
# shared memory, no spills under Triton 3.6 / 3.8 / 3.9 on sm_90 / 100 / 120). LARGE (64-column
# splits, two tiles a program, V4-Pro's columns; not timed) keeps 8 warps.
# One stage (at 32 columns per split a program has one tile: a cp.async stage would only add a
# shared-memory round trip before the dequantization; at 64, two stages would prefetch the second
# tile but need 101 KB of shared memory, past sm_120's 99 KB).
# Session 9's sliced tiles (S as a chain of 128-wide slices, each gathered and dequantized on its
# own, then the whole tile again for P V; 10.19 / 9.59 / 9.39 µs at r4 / r128 / r0 B1 on the H200
# against the bf16 rows' 6.81 / 6.12 / 5.72): DECODE_CONFIG_SMALL_PACKED_SLICED.
DECODE_CONFIG_SMALL_PACKED = dict(DECODE_CONFIG_SMALL, num_warps=4, num_stages=1)
DECODE_CONFIG_LARGE_PACKED = dict(DECODE_CONFIG_LARGE, num_warps=8, num_stages=1)
DECODE_CONFIG_SMALL_PACKED_SLICED = _sliced(dict(DECODE_CONFIG_SMALL, num_warps=8))
SMALL_DECODE_PAIRS = 1024
# B1 over a table wider than SMALL_DECODE_PAIRS (V4-Pro's 1152 top-k columns; HCA rows, whose width
# is 128 + max_model_len / 128 whatever the context): the split width follows each token's live
# columns on the device, 32 up to SMALL_DECODE_PAIRS live, 64 past it; the grid has the 32-column
# splits' count and the programs past a token's live columns load and store nothing. H200, session
# 19 (HCA 128 + 1024 columns, µs, bf16 / packed; timed with those programs returning at once): 144
# live (a 2K context) 6.15 / 6.40 against SMALL 7.28 / 7.37 and LARGE 7.90 / 9.41 (the 8448-token
# cache's 194 columns: 5.98 / 6.17); all 1152 live 8.96 / 9.85 against SMALL 12.22 / 12.26 and
# LARGE 8.65 / 10.10.
DECODE_CONFIG_LIVE = dict(DECODE_CONFIG_SMALL, WIDE_FROM=SMALL_DECODE_PAIRS, WIDE_COLS_PER_SPLIT=64)
DECODE_CONFIG_LIVE_PACKED = dict(DECODE_CONFIG_SMALL_PACKED, WIDE_FROM=SMALL_DECODE_PAIRS, WIDE_COLS_PER_SPLIT=64)
# Decode steps of TWO_PASS_MIN_TOKENS or more tokens take the two-pass kernels
# (sparse_attn_two_pass.py): bf16 P between a scores and a values launch instead of fp32 split
# partials. Scores: one 64-column tile for all 64 heads (wgmma's M on sm_90) per program, S
# accumulated over 64-wide slices of the head dim in a 4-stage cp.async pipeline; values: 32
# output dims per program, two tiles per step. H200 sweeps (docs/performance.md item 16): B8
# r4 / r128 / r0 9.8 / 8.3 / 6.8 µs against split-K's 15.1 / 11.5 / 7.3; B4 9.4 / 8.0 / 6.6
# against 11.0 / 8.6 / 6.4. At B2 split-K is ~1 µs faster, but every multi-sequence step takes
# the same kernels, so an engine step of 3 sequences computes the same bits eagerly and in its
# CUDA graph padded to 4.
TWO_PASS_MIN_TOKENS = 2
DECODE_CONFIG_TWO_PASS = dict(KERNEL="two_pass", BLOCK_H=64, BLOCK_T=64, BLOCK_K=64, BLOCK_DV=32, PDL=True,
                              SCORES=dict(num_warps=4, num_stages=4), VALUES=dict(num_warps=4, num_stages=3))
# Over packed rows on sm_90 / sm_100 the scores pass gathers its whole [64, 512] tile in one round
# of loads, dequantizes it at once over 8 warps and computes S as one dot (WHOLE_TILE, 1 stage): the
# K loop's per-slice dequantization chains at 4 warps bound it (H200 sweep, session 10: r4 B8 13.81
# µs against 15.06 for the K loop). Q and the tile take 128 KB of shared memory (codegen check): past
# the 99 KB of sm_86 / sm_89 / sm_120, where it also spills (152 B on sm_120), so those archs (and
# sm_80, not timed) keep the K loop. The values pass keeps the bf16 tiles. Sweep variant
# UNPACKED_ROWS=True (sparse_attn_two_pass.py): the scores pass writes its dequantized tiles as bf16
# rows and the values pass runs the bf16 loop over them (session 13: predicted to win at r4 / r128
# B8; switch here if the sweep agrees at every B8 shape).
DECODE_CONFIG_TWO_PASS_PACKED = dict(DECODE_CONFIG_TWO_PASS, WHOLE_TILE=True, SCORES=dict(num_warps=8, num_stages=1))


# sm_90 under Triton 3.6 with D = 512 (the production shape): the warp-specialised Gluon kernel
# (sparse_attn_gluon.py; KERNEL="ws" in a tile config selects it), 64-column tiles in a ring of 2
# (32-column tiles in a ring of 4: 5-30% slower, docs/performance.md item 15). It compiles under
# 3.8 / 3.9 too, but has only run under 3.6, so other versions keep the `tl` kernel.
PREFILL_CONFIG_WS = dict(KERNEL="ws", BLOCK_T=64, KV_STAGES=2)


def prefill_config(device: torch.device, head_dim: int = WS_HEAD_DIM, packed: bool = False) -> dict:
    """The production prefill tiles for the GPU `device` is on, at this head dim (packed: over
    packed fp8 rows)."""
    configs = PREFILL_CONFIGS_PACKED if packed else PREFILL_CONFIGS
    if not compiled_on_cuda(device):
        return PREFILL_CONFIG_PACKED if packed else PREFILL_CONFIG
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) == (9, 0) and head_dim == WS_HEAD_DIM and not triton_at_least(3, 7) and not packed:
        return PREFILL_CONFIG_WS
    if (major, minor) == (8, 0) or major in (9, 10):
        return configs[major * 10]
    return configs[120]  # sm_86, sm_89, sm_12x: 99 KB of shared memory per block


def decode_config(n_tokens: int, n_columns: int, packed: bool = False, device: torch.device | None = None) -> dict:
    """The production decode tiles for `n_tokens` query tokens (B at M = 1) over `n_columns` columns
    (packed: over packed fp8 rows) on the GPU `device` is on (None: sm_90's tiles)."""
    if n_tokens >= TWO_PASS_MIN_TOKENS:
        return DECODE_CONFIG_TWO_PASS_PACKED if packed and _whole_tile_scores_fit(device) else DECODE_CONFIG_TWO_PASS
    if n_tokens * n_columns <= SMALL_DECODE_PAIRS:
        return DECODE_CONFIG_SMALL_PACKED if packed else DECODE_CONFIG_SMALL
    return DECODE_CONFIG_LIVE_PACKED if packed else DECODE_CONFIG_LIVE


def _whole_tile_scores_fit(device: torch.device | None) -> bool:
    """Whether the packed two-pass scores pass takes its whole tile at once: on sm_90 / sm_100 (227 KB
    of shared memory per block), in the interpreter, and for device None."""
    return device is None or not compiled_on_cuda(device) or torch.cuda.get_device_capability(device)[0] in (9, 10)


LOG2E = 1.4426950408889634


@triton.jit
def _sparse_attn_kernel(
    q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, part_ptr, m_ptr, l_ptr, ticket_ptr,
    H, D, C, n_window, cols_per_split, wide_from, wide_cols_per_split, n_splits, qk_scale_log2,
    stride_qt, stride_qh, stride_pool, stride_it, stride_ot, stride_oh,
    stride_pt, stride_ps, stride_ph, stride_mt, stride_ms,
    HAS_COUNTS: tl.constexpr, SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    PDL: tl.constexpr = False, PACKED: tl.constexpr = False, PK_FP4: tl.constexpr = False, PK_NQ: tl.constexpr = 0,
    PK_BLOCK: tl.constexpr = 1, PK_TAIL_OFF: tl.constexpr = 0, PK_SCALE_OFF: tl.constexpr = 0,
    PK_HAS_TAIL: tl.constexpr = False, PK_PAYLOAD: tl.constexpr = 0, PK_ROW_BYTES: tl.constexpr = 0,
    PK_FP8_CVT: tl.constexpr = False, PK_BF16_OPERAND: tl.constexpr = False,
):
    """S = Q K^T as one dot over the whole [BLOCK_T, BLOCK_D] tile (the bf16 production kernel)."""
    _sparse_attn_program(
        q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, part_ptr, m_ptr, l_ptr, ticket_ptr,
        H, D, C, n_window, cols_per_split, wide_from, wide_cols_per_split, n_splits, qk_scale_log2,
        stride_qt, stride_qh, stride_pool, stride_it, stride_ot, stride_oh,
        stride_pt, stride_ps, stride_ph, stride_mt, stride_ms,
        HAS_COUNTS, SPLIT, FUSED_MERGE, BLOCK_H, BLOCK_T, BLOCK_D, EVEN_D, PDL, PACKED, PK_NQ, PK_BLOCK,
        PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_FP8_CVT, PK_BF16_OPERAND, 0)


@triton.jit
def _sparse_attn_sliced_kernel(
    q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, part_ptr, m_ptr, l_ptr, ticket_ptr,
    H, D, C, n_window, cols_per_split, wide_from, wide_cols_per_split, n_splits, qk_scale_log2,
    stride_qt, stride_qh, stride_pool, stride_it, stride_ot, stride_oh,
    stride_pt, stride_ps, stride_ph, stride_mt, stride_ms,
    HAS_COUNTS: tl.constexpr, SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    PDL: tl.constexpr = False, PACKED: tl.constexpr = False, PK_FP4: tl.constexpr = False, PK_NQ: tl.constexpr = 0,
    PK_BLOCK: tl.constexpr = 1, PK_TAIL_OFF: tl.constexpr = 0, PK_SCALE_OFF: tl.constexpr = 0,
    PK_HAS_TAIL: tl.constexpr = False, PK_PAYLOAD: tl.constexpr = 0, PK_ROW_BYTES: tl.constexpr = 0,
    PK_FP8_CVT: tl.constexpr = False, QK_SLICE: tl.constexpr = 64,
):
    """S = Q K^T as a chain of dots over QK_SLICE-wide slices of the head dim (the tiles over packed
    rows): each K slice is gathered and dequantized on its own, only P V takes the whole tile."""
    _sparse_attn_program(
        q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, part_ptr, m_ptr, l_ptr, ticket_ptr,
        H, D, C, n_window, cols_per_split, wide_from, wide_cols_per_split, n_splits, qk_scale_log2,
        stride_qt, stride_qh, stride_pool, stride_it, stride_ot, stride_oh,
        stride_pt, stride_ps, stride_ph, stride_mt, stride_ms,
        HAS_COUNTS, SPLIT, FUSED_MERGE, BLOCK_H, BLOCK_T, BLOCK_D, EVEN_D, PDL, PACKED, PK_NQ, PK_BLOCK,
        PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_FP8_CVT, False, QK_SLICE)


@triton.jit
def _sparse_attn_program(
    q_ptr, win_ptr, cmp_ptr, idx_ptr, counts_ptr, sink_ptr, out_ptr, part_ptr, m_ptr, l_ptr, ticket_ptr,
    H, D, C, n_window, cols_per_split, wide_from, wide_cols_per_split, n_splits, qk_scale_log2,
    stride_qt, stride_qh, stride_pool, stride_it, stride_ot, stride_oh,
    stride_pt, stride_ps, stride_ph, stride_mt, stride_ms,
    HAS_COUNTS: tl.constexpr, SPLIT: tl.constexpr, FUSED_MERGE: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, EVEN_D: tl.constexpr,
    PDL: tl.constexpr, PACKED: tl.constexpr, PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr,
    PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr, PK_FP8_CVT: tl.constexpr,
    PK_BF16_OPERAND: tl.constexpr, QK_SLICE: tl.constexpr,
):
    if PDL:
        # Let the merge kernel (launched with programmatic dependent launch) start its prologue now;
        # its griddepcontrol.wait still waits for this whole grid and its memory.
        gdc_launch_dependents()
    tok = tl.program_id(0).to(tl.int64)
    hblock = tl.program_id(1)
    split = tl.program_id(2)
    bound = column_bound(counts_ptr, tok, C, n_window, HAS_COUNTS)
    cols_per_split = split_width(bound, cols_per_split, wide_from, wide_cols_per_split)
    lo = split * cols_per_split
    heads = hblock * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    head_ok = heads < H
    if SPLIT and not FUSED_MERGE:
        # A split past the token's live columns (a short context in a wide cache) loads and stores
        # nothing (its masks are all off; its loop is empty): the merge stops below it.
        head_ok = head_ok & ((split == 0) | (lo < bound))
    if EVEN_D:
        dim_ok = tl.full([BLOCK_D], True, tl.int1)  # D == BLOCK_D: no column mask to compute
    else:
        dim_ok = dims < D

    if not QK_SLICE:
        q = tl.load(q_ptr + tok * stride_qt + heads[:, None] * stride_qh + dims[None, :],
                    mask=head_ok[:, None] & dim_ok[None, :], other=0.0)
    sink = tl.load(sink_ptr + heads, mask=head_ok, other=0.0) * 1.4426950408889634

    hi = tl.minimum(bound, lo + cols_per_split)

    m_i = sink
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for start in range(lo, hi, BLOCK_T):
        if QK_SLICE:
            s, kv, live = sliced_scores(q_ptr + tok * stride_qt + heads * stride_qh, head_ok, win_ptr, cmp_ptr,
                                        idx_ptr, tok, stride_it, stride_pool, n_window, start + tl.arange(0, BLOCK_T),
                                        hi, D, BLOCK_H, BLOCK_D, QK_SLICE, PACKED, PK_NQ, PK_BLOCK, PK_TAIL_OFF,
                                        PK_SCALE_OFF, PK_HAS_TAIL, PK_FP8_CVT)
            s = s * qk_scale_log2
        else:
            if PACKED:
                kv, live = gather_packed_kv_tile(win_ptr, cmp_ptr, idx_ptr, tok, stride_it, stride_pool, n_window,
                                                 start + tl.arange(0, BLOCK_T), hi, 0, D, BLOCK_D, PK_NQ, PK_BLOCK,
                                                 PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, PK_FP8_CVT)
                kv = bf16_operand_boundary(kv, PK_BF16_OPERAND)
            else:
                kv, live = gather_kv_tile(win_ptr, cmp_ptr, idx_ptr, tok, stride_it, stride_pool, n_window,
                                          start + tl.arange(0, BLOCK_T), hi, dims, dim_ok)
            s = tl.dot(q, tl.trans(kv)) * qk_scale_log2
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(kv.dtype), kv)
        m_i = m_new

    tile_mask = head_ok[:, None] & dim_ok[None, :]
    out_offs = tok * stride_ot + heads[:, None] * stride_oh + dims[None, :]
    if SPLIT:
        part_offs = tok * stride_pt + heads[:, None] * stride_ph + dims[None, :]
        ml_offs = tok * stride_mt + heads
        tl.store(part_ptr + part_offs + split * stride_ps, acc, mask=tile_mask)
        tl.store(m_ptr + ml_offs + split * stride_ms, m_i, mask=head_ok)
        tl.store(l_ptr + ml_offs + split * stride_ms, l_i, mask=head_ok)
        if FUSED_MERGE:
            # The last split program of this (token, head block) to finish merges every split: the
            # barrier orders the whole program's stores before the ticket, acq_rel publishes them
            # (release) and makes the other programs' stores visible to the last one (acquire).
            tl.debug_barrier()
            ticket_at = ticket_ptr + tok * tl.num_programs(1) + hblock
            ticket = tl.atomic_add(ticket_at, 1, sem="acq_rel")
            if ticket == n_splits - 1:
                m = sink
                for s_ in range(0, n_splits):
                    m = tl.maximum(m, tl.load(m_ptr + ml_offs + s_ * stride_ms, mask=head_ok,
                                              other=float("-inf"), cache_modifier=".cg"))
                denom = tl.exp2(sink - m)
                o = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
                for s_ in range(0, n_splits):
                    m_s = tl.load(m_ptr + ml_offs + s_ * stride_ms, mask=head_ok, other=float("-inf"),
                                  cache_modifier=".cg")
                    l_s = tl.load(l_ptr + ml_offs + s_ * stride_ms, mask=head_ok, other=0.0, cache_modifier=".cg")
                    w = tl.exp2(m_s - m)
                    denom += l_s * w
                    o += w[:, None] * tl.load(part_ptr + part_offs + s_ * stride_ps, mask=tile_mask, other=0.0,
                                              cache_modifier=".cg")
                tl.store(out_ptr + out_offs, (o / denom[:, None]).to(out_ptr.dtype.element_ty), mask=tile_mask)
                tl.atomic_xchg(ticket_at, 0)  # ready for the next launch (graph replays too)
    else:
        inv_l = 1.0 / (l_i + tl.exp2(sink - m_i))
        tl.store(out_ptr + out_offs, (acc * inv_l[:, None]).to(out_ptr.dtype.element_ty), mask=tile_mask)


@triton.jit
def _sparse_attn_merge_kernel(
    part_ptr, m_ptr, l_ptr, sink_ptr, out_ptr, counts_ptr,
    H, D, C, n_window, cols_per_split, wide_from, wide_cols_per_split, n_splits,
    stride_pt, stride_ps, stride_ph, stride_mt, stride_ms, stride_ot, stride_oh,
    HAS_COUNTS: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, PDL: tl.constexpr = False,
    ROUNDS: tl.constexpr = False,
):
    """out[tok, head] = sum_s 2^(m_s - m) part_s / (sum_s 2^(m_s - m) l_s + 2^(sink - m)), m = max(sink,
    max_s m_s), over the splits that hold a live column of the token (split 0 always; a split past the
    token's live columns writes nothing): one block of BLOCK_S >= n_splits splits, or (ROUNDS: a wide
    cache's many splits) BLOCK_S splits a round."""
    tok = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    ml_row = tok * stride_mt + head
    part_row = part_ptr + tok * stride_pt + head * stride_ph + dims[None, :]
    bound = column_bound(counts_ptr, tok, C, n_window, HAS_COUNTS)
    cols_per_split = split_width(bound, cols_per_split, wide_from, wide_cols_per_split)
    n_splits = tl.minimum(n_splits, tl.maximum(tl.cdiv(bound, cols_per_split), 1))
    if PDL:
        gdc_wait()  # the split kernel's partials are complete and visible past this point
    if ROUNDS:
        sink = tl.load(sink_ptr + head) * 1.4426950408889634
        m = sink
        for s0 in range(0, n_splits, BLOCK_S):
            m_s = tl.load(m_ptr + ml_row + (s0 + splits) * stride_ms, mask=s0 + splits < n_splits,
                          other=float("-inf"))
            m = tl.maximum(tl.max(m_s, 0), m)
        denom = tl.exp2(sink - m)
        acc = tl.zeros([BLOCK_D], dtype=tl.float32)
        for s0 in range(0, n_splits, BLOCK_S):
            split_ok = s0 + splits < n_splits
            m_s = tl.load(m_ptr + ml_row + (s0 + splits) * stride_ms, mask=split_ok, other=float("-inf"))
            l_s = tl.load(l_ptr + ml_row + (s0 + splits) * stride_ms, mask=split_ok, other=0.0)
            w = tl.exp2(m_s - m)
            denom += tl.sum(l_s * w, 0)
            part = tl.load(part_row + (s0 + splits)[:, None] * stride_ps, mask=split_ok[:, None] & (dims < D)[None, :],
                           other=0.0)
            acc += tl.sum(part * w[:, None], 0)
        out = acc / denom
    else:
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


def sparse_attn_paged_triton(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts=None, tile_config=None,
                             row_format=None, unpack_bound=None):
    """Launch the kernels; q [B, M, H, D] and both pools bf16 (or uint8 rows of the packed
    `row_format`). tile_config defaults to the production one (prefill_config(device) when M > 1,
    decode_config(B, C) when M == 1). unpack_bound: the most distinct rows idx names (prefill
    over packed rows: the size of the unpacked pool, kv_compact.py; None: from the shapes)."""
    B, M, H, D = q.shape
    if row_format is not None and (row_format.value_bits != 8 or row_format.scale_kind != "ue8m0"):
        raise ValueError(f"the attention kernels read fp8 rows with ue8m0 scales, not {row_format.name}")
    pk = {} if row_format is None else dict(PACKED=True, **packed_constexprs(row_format, D))
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
    qk_scale_log2 = float(scale) * LOG2E
    if M > 1 and pk and tile_config is None:
        return _prefill_over_unpacked_rows(q, win_pool, cmp_pool, it, n_window, sink, scale, counts, row_format,
                                           unpack_bound)
    if M > 1:
        cfg = dict(prefill_config(q.device, D, bool(pk)) if tile_config is None else tile_config)
    else:
        cfg = dict(decode_config(T, C, bool(pk), q.device) if tile_config is None else tile_config)
    kernel = cfg.pop("KERNEL", "tl")
    pdl = cfg.pop("PDL", False) and pdl_supported(q.device)
    fp8_cvt = cfg.pop("FP8_CVT", None)  # packed rows: None = the hardware e4m3 conversion where there is one
    bf16_operand = cfg.pop("BF16_OPERAND", True)  # packed rows, split-K: see sparse_attn_tiles.bf16_operand_boundary
    if pk:
        pk["PK_FP8_CVT"] = fp8_conversion_supported(q.device) if fp8_cvt is None else bool(fp8_cvt)
    if kernel == "unpack":  # packed rows: each token's columns unpacked, then the bf16 launch (a comparison)
        if not pk:
            raise ValueError("tile config KERNEL 'unpack' reads packed rows (row_format)")
        rows, cols = unpack_columns(win, cmp, it, ct, n_window, D, counts is not None, row_format,
                                    fp8_cvt=pk["PK_FP8_CVT"])
        return sparse_attn_paged_triton(q, rows, rows, cols.reshape(B, M, C), n_window, sink, scale, counts,
                                        tile_config=cfg.get("INNER"))
    if kernel == "two_pass":
        return sparse_attn_two_pass(qt, win, cmp, it, ct, sink, out, n_window, qk_scale_log2, counts is not None,
                                    pdl, cfg, pk).reshape(B, M, H, D)
    ws = kernel == "ws"
    if ws and D != WS_HEAD_DIM:
        raise ValueError(f"the warp-specialised kernel takes D = {WS_HEAD_DIM}, got {D}")
    if ws and pk:
        raise ValueError("the warp-specialised kernel reads bf16 rows only, not packed rows (row_format)")
    # QK_SLICE in the tiles: the sliced kernel (S as a chain over head-dim slices); else the whole-tile one.
    qk_slice = cfg.pop("QK_SLICE", 0)
    attn_kernel = _sparse_attn_sliced_kernel if qk_slice else _sparse_attn_kernel
    if pk and not qk_slice:
        pk["PK_BF16_OPERAND"] = bool(bf16_operand) and compiled_on_cuda(q.device)  # no inline asm in the interpreter
    cols_per_split = cfg.pop("COLS_PER_SPLIT", None)
    cols_per_split = max(1, C) if cols_per_split is None else max(1, min(cols_per_split, C))
    # A token with more than WIDE_FROM live columns takes splits of WIDE_COLS_PER_SPLIT (the grid
    # has the narrow splits' count; the rest load and store nothing): the split width follows the
    # live columns. split_widths: (cols_per_split, wide_from, wide_cols_per_split) as the kernels take them.
    wide_from = cfg.pop("WIDE_FROM", None)
    split_widths = ((cols_per_split, max(1, C), cols_per_split) if wide_from is None
                    else (cols_per_split, wide_from, cfg.pop("WIDE_COLS_PER_SPLIT")))
    merge = cfg.pop("MERGE", "kernel")
    BLOCK_D = max(16, triton.next_power_of_2(D))
    even_d = BLOCK_D == D
    if qk_slice:
        cfg["QK_SLICE"] = min(qk_slice, BLOCK_D)
    common = (qt, win, cmp, it, ct, sink, out)
    n_splits = max(1, triton.cdiv(C, cols_per_split)) if M == 1 else 1
    if ws:
        return _run_ws(qt, win, cmp, it, ct, sink, out, n_window, cols_per_split, n_splits, qk_scale_log2,
                       counts is not None, pdl, cfg).reshape(B, M, H, D)
    n_hblocks = triton.cdiv(H, cfg["BLOCK_H"])
    if n_splits == 1:
        # One program per (token, head block) over every column: the output is written directly.
        attn_kernel[(T, n_hblocks, 1)](
            *common, out, out, out, out,
            H, D, C, n_window, max(C, 1), max(C, 1), max(C, 1), 1, qk_scale_log2,
            qt.stride(0), qt.stride(1), win.stride(0), it.stride(0), out.stride(0), out.stride(1),
            0, 0, 0, 0, 0,
            HAS_COUNTS=counts is not None, SPLIT=False, FUSED_MERGE=False, BLOCK_D=BLOCK_D, EVEN_D=even_d, **cfg,
            **pk,
        )
        return out.reshape(B, M, H, D)
    part, m_part, l_part = _partials(T, n_splits, H, D, q.device)
    fused = merge == "fused"
    if fused and wide_from is not None:
        raise ValueError("MERGE 'fused' counts every split: it takes no WIDE_FROM")
    tickets = torch.zeros(T * n_hblocks, dtype=torch.int32, device=q.device) if fused else it
    attn_kernel[(T, n_hblocks, n_splits)](
        *common, part, m_part, l_part, tickets,
        H, D, C, n_window, *split_widths, n_splits, qk_scale_log2,
        qt.stride(0), qt.stride(1), win.stride(0), it.stride(0), out.stride(0), out.stride(1),
        part.stride(0), part.stride(1), part.stride(2), m_part.stride(0), m_part.stride(1),
        HAS_COUNTS=counts is not None, SPLIT=True, FUSED_MERGE=fused, BLOCK_D=BLOCK_D, EVEN_D=even_d,
        PDL=pdl and not fused,
        **cfg, **pk,
    )
    if fused:
        return out.reshape(B, M, H, D)
    _merge(part, m_part, l_part, sink, out, ct, C, n_window, split_widths, counts is not None, pdl)
    return out.reshape(B, M, H, D)


def _prefill_over_unpacked_rows(q, win_pool, cmp_pool, cols, n_window, sink, scale, counts, row_format, bound):
    """Production prefill over packed rows: every row the step references unpacked once
    (kv_compact.py, no host sync), then the bf16 prefill kernels (Gluon on sm_90) over them."""
    rows, renumbered = unpack_referenced_rows(win_pool, cmp_pool, cols, n_window, row_format, q.shape[-1],
                                              counts=None if counts is None else counts.reshape(-1), max_rows=bound,
                                              impl="triton")
    return sparse_attn_paged_triton(q, rows, rows, renumbered.reshape(*q.shape[:2], -1),
                                    n_window, sink, scale, counts)  # one pool for both


def sparse_attn_two_formats_triton(q, win_pool, cmp_pool, idx, n_window, sink, scale, counts, win_format,
                                   cmp_format, unpack_bound=None, route=None):
    """Attention over window rows and compressed rows in two packed formats (DeepSeek-V4.1:
    fp8_e8m0_b32 and fp4_e4m3_b16, each pool its own row stride): the rows a step reads are
    unpacked to bf16 first, then the bf16 kernels run. Decode (M == 1) unpacks each token's
    columns (route "columns", sparse_attn_unpacked_decode.py: T * C rows, sized by the shapes);
    prefill unpacks every referenced row once (route "compact", kv_compact.py, at most
    `unpack_bound` rows). No host sync either way. `route` None: by M as above (a sweep's
    candidates name one: bench/v41_attn_configs.py)."""
    B, M, H, D = q.shape
    if q.dtype != torch.bfloat16:
        raise ValueError(f"the Triton kernels take bf16 q, got {q.dtype}")
    check_16_byte_aligned("win_pool", win_pool)
    check_16_byte_aligned("cmp_pool", cmp_pool)
    C = idx.shape[2]
    it = idx.reshape(B * M, C)
    if it.stride(1) != 1:
        it = it.contiguous()
    flat_counts = None if counts is None else counts.reshape(B * M)
    if (route or ("columns" if M == 1 else "compact")) == "columns":
        win = win_pool if win_pool.shape[0] else cmp_pool  # an empty pool's columns are holes: never read
        cmp = cmp_pool if cmp_pool.shape[0] else win_pool
        rows, cols = unpack_columns(win, cmp, it, it if counts is None else flat_counts, n_window, D,
                                    counts is not None, win_format, cmp_format,
                                    fp8_cvt=fp8_conversion_supported(q.device))
    else:
        rows, cols = unpack_referenced_rows(win_pool, cmp_pool, it, n_window, win_format, D, counts=flat_counts,
                                            max_rows=unpack_bound, impl="triton", cmp_fmt=cmp_format)
    return sparse_attn_paged_triton(q, rows, rows, cols.reshape(B, M, C), n_window, sink, scale, counts)


def _partials(T, n_splits, H, D, device):
    """Split-K state: part [T, n_splits, H, D], m and l [T, n_splits, H], all fp32."""
    m_part = torch.empty(T, n_splits, H, dtype=torch.float32, device=device)
    return torch.empty(T, n_splits, H, D, dtype=torch.float32, device=device), m_part, torch.empty_like(m_part)


# The merge reads up to MERGE_MAX_SPLITS splits in one block (every decode step of V4 / V4-Pro up
# to 2048 columns: the kernel's code before session 18); more (HCA rows of a 1M-token max_model_len:
# 130 splits) in rounds of that many instead of a [splits, D] fp32 tile in registers.
MERGE_MAX_SPLITS = 32


def _merge(part, m_part, l_part, sink, out, counts, C, n_window, split_widths, has_counts, pdl):
    """Merge the split partials of the splits below each token's live-column bound (`counts` as the
    split kernel read them: the idx rows when there are none). split_widths: (cols_per_split,
    wide_from, wide_cols_per_split) as the split kernel took them."""
    T, n_splits, H, D = part.shape
    cols, wide_from, wide_cols = split_widths
    # The most splits a token can have live: narrow splits up to wide_from columns, wide ones past it
    # (at 1152 columns, 32 and 18 of a grid of 36: one block, no rounds).
    live_splits = min(n_splits, max(triton.cdiv(min(wide_from, C), cols), triton.cdiv(C, wide_cols)))
    block_s = min(triton.next_power_of_2(live_splits), MERGE_MAX_SPLITS)
    _sparse_attn_merge_kernel[(T, H)](
        part, m_part, l_part, sink, out, counts,
        H, D, C, n_window, *split_widths, n_splits,
        part.stride(0), part.stride(1), part.stride(2), m_part.stride(0), m_part.stride(1),
        out.stride(0), out.stride(1),
        HAS_COUNTS=has_counts, BLOCK_S=block_s, BLOCK_D=max(16, triton.next_power_of_2(D)),
        ROUNDS=block_s < live_splits, num_warps=4,
        **(dict(PDL=True, launch_pdl=True) if pdl else {}),
    )


def _run_ws(qt, win, cmp, it, ct, sink, out, n_window, cols_per_split, n_splits, qk_scale_log2, has_counts, pdl,
            cfg):
    """The warp-specialised kernel (sparse_attn_gluon.py), then the merge kernel when it splits."""
    T, H, D = qt.shape
    if n_splits == 1:
        return sparse_attn_ws(qt, win, cmp, it, ct, sink, out, out, out, out, n_window, max(it.shape[1], 1), 1,
                              qk_scale_log2, has_counts, sm_count(qt.device), cfg)
    part, m_part, l_part = _partials(T, n_splits, H, D, qt.device)
    sparse_attn_ws(qt, win, cmp, it, ct, sink, out, part, m_part, l_part, n_window, cols_per_split, n_splits,
                   qk_scale_log2, has_counts, sm_count(qt.device), cfg)
    _merge(part, m_part, l_part, sink, out, ct, it.shape[1], n_window, (cols_per_split, it.shape[1], cols_per_split),
           has_counts, pdl)
    return out
