"""Triton kernels of the row compaction (math: kv_compact.py), with no host sync.

Layouts. win_pool / cmp_pool uint8 [N_w | N_c, >= row_bytes] packed rows, each pool in its own
format and row stride (V4: both fp8_e8m0_b64_rope64; V4.1: fp8_e8m0_b32 window rows and
fp4_e4m3_b16 compressed rows; decoders in kv_pack_triton.py / kv_pack_fp4_e4m3_triton.py), rows
16-byte aligned; cols int32 [T, C]
(unit stride along C; the first n_window columns name win_pool rows, the rest cmp_pool rows;
-1 = hole); counts [T] int32 (optional: columns >= n_window + counts[t] are dead). Rows are numbered across both pools,
g = col (window column) or N_w + col (compressed column), so the tables below have N_w + N_c
entries. Outputs: rows [R, D] bf16 (R = the caller's bound on the used rows; rows past the used
count are not written) and renumbered int32 [T, C].

Launches (all sizes from shapes known on the host: CUDA-graph capturable):
1. `torch.zeros`:                     used int32 [N_w + N_c]
2. `_flag_used_rows_kernel`:          used[g(t, c)] = 1 for every live column (plain stores, every
                                      writer stores the same 1, skipped where the flag already reads
                                      1), grid (cdiv(T * C, BLOCK_E),)
3. `torch.cumsum(used, dtype=int32)`: ends [N_w + N_c]; a used row's slot is ends[g] - 1 (the only
                                      global dependency)
4. `_unpack_and_renumber_kernel`:     one launch, three kinds of program. The first
                                      cdiv(N_w, BLOCK_R) programs each look at BLOCK_R window rows,
                                      the next cdiv(N_c, BLOCK_R) at BLOCK_R compressed rows (row g
                                      is used where ends[g] != ends[g - 1]) and unpack the used ones
                                      (slot < R) into rows[slot] in their pool's format (16-byte
                                      loads of codes; scale bytes as int32 words or 16-byte loads:
                                      kv_pack_fp4_e4m3_triton.load_row_values); the rest rewrite
                                      BLOCK_E columns each: slot or -1.
Columns are read as int32 words over the flattened [T, C] table (t = e // C), once in 2 and once in
4; the flag and slot tables are small and stay in L2.
"""

import torch
import triton
import triton.language as tl

from v4serve.ops.kv_pack_fp4_e4m3_triton import load_row_values, row_block_d, row_constexprs

BLOCK_R = 16  # pool rows per unpack program (as kv_pack_triton's unpack kernel)
# Production launch (not timed yet; bench/kernel_configs.py 'kv compact' sweeps the alternatives):
# BLOCK_E columns per program of the flag and renumber passes (16 int32 per thread at 4 warps);
# SKIP_SEEN: the flag pass loads a flag before storing it and skips the store when it reads 1.
COMPACT_CONFIG = dict(BLOCK_E=2048, SKIP_SEEN=True)
BLOCK_E = COMPACT_CONFIG["BLOCK_E"]


@triton.jit
def _column_rows(cols_ptr, counts_ptr, e, T, C, n_window, n_win_rows, stride_ct, HAS_COUNTS: tl.constexpr):
    """Flat columns e (int32) of the [T, C] table -> (row number g across both pools (int64), live)."""
    t = e // C
    c = e - t * C
    inside = t < T
    col = tl.load(cols_ptr + t.to(tl.int64) * stride_ct + c, mask=inside, other=-1)
    live = inside & (col >= 0)
    if HAS_COUNTS:
        live &= c < n_window + tl.maximum(tl.load(counts_ptr + t, mask=inside, other=0), 0)
    g = col.to(tl.int64) + tl.where(c < n_window, 0, n_win_rows).to(tl.int64)
    return g, live


@triton.jit
def _flag_used_rows_kernel(cols_ptr, counts_ptr, used_ptr, T, C, n_window, n_win_rows, stride_ct,
                           HAS_COUNTS: tl.constexpr, BLOCK_E: tl.constexpr, SKIP_SEEN: tl.constexpr):
    e = tl.program_id(0) * BLOCK_E + tl.arange(0, BLOCK_E)
    g, live = _column_rows(cols_ptr, counts_ptr, e, T, C, n_window, n_win_rows, stride_ct, HAS_COUNTS)
    # Store only flags this SM has not seen set: every column of a row would otherwise store to the
    # same few L2 lines (a row of the r4 S8192 case is named ~1,800 times); the check mostly hits L1.
    if SKIP_SEEN:
        live &= tl.load(used_ptr + g, mask=live, other=1) == 0
    tl.store(used_ptr + g, tl.full([BLOCK_E], 1, tl.int32), mask=live)


@triton.jit
def _unpack_used_rows(block, pool_ptr, n_rows, g0, ends_ptr, rows_ptr, max_rows, D, stride_pool, stride_rows,
                      BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, FP4_E4M3: tl.constexpr, PK_NQ: tl.constexpr,
                      PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr,
                      PK_HAS_TAIL: tl.constexpr):
    """Rows [block * BLOCK_R, +BLOCK_R) of one pool (its rows are g0 + r across both pools): each
    used one (slot < max_rows) unpacked into rows[slot]."""
    r = block.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    inside = r < n_rows
    g = g0 + r
    end = tl.load(ends_ptr + g, mask=inside, other=0)
    used = end != tl.load(ends_ptr + g - 1, mask=inside & (g > 0), other=0)  # used[g] = ends[g] - ends[g - 1]
    slot = end.to(tl.int64) - 1
    take = inside & used & (slot < max_rows)
    if tl.max(take.to(tl.int32), 0) > 0:
        v = load_row_values(pool_ptr + r * stride_pool, take, D, BLOCK_D, FP4_E4M3, PK_NQ,
                            PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL, rows_ptr.dtype.element_ty)
        ch = tl.arange(0, BLOCK_D)
        tl.store(rows_ptr + slot[:, None] * stride_rows + ch[None, :], v, mask=take[:, None] & (ch < D)[None, :])


@triton.jit
def _renumber_columns(block, cols_ptr, counts_ptr, ends_ptr, out_cols_ptr, T, C, n_window, n_win_rows, max_rows,
                      stride_ct, HAS_COUNTS: tl.constexpr, BLOCK_E: tl.constexpr):
    """Flat columns [block * BLOCK_E, +BLOCK_E) of the [T, C] output: the row's slot, or -1."""
    e = block * BLOCK_E + tl.arange(0, BLOCK_E)
    g, live = _column_rows(cols_ptr, counts_ptr, e, T, C, n_window, n_win_rows, stride_ct, HAS_COUNTS)
    slot = tl.load(ends_ptr + g, mask=live, other=0) - 1
    tl.store(out_cols_ptr + e, tl.where(live & (slot < max_rows), slot, -1), mask=e < T * C)


@triton.jit
def _unpack_and_renumber_kernel(
    win_ptr, cmp_ptr, ends_ptr, rows_ptr, cols_ptr, counts_ptr, out_cols_ptr,
    n_win_rows, n_cmp_rows, max_rows, T, C, n_window, D, stride_win, stride_cmp, stride_rows, stride_ct,
    win_programs, cmp_programs,
    HAS_COUNTS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    W_FP4_E4M3: tl.constexpr, W_NQ: tl.constexpr, W_BLOCK: tl.constexpr, W_TAIL_OFF: tl.constexpr,
    W_SCALE_OFF: tl.constexpr, W_HAS_TAIL: tl.constexpr,
    C_FP4_E4M3: tl.constexpr, C_NQ: tl.constexpr, C_BLOCK: tl.constexpr, C_TAIL_OFF: tl.constexpr,
    C_SCALE_OFF: tl.constexpr, C_HAS_TAIL: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < win_programs:
        _unpack_used_rows(pid, win_ptr, n_win_rows, 0, ends_ptr, rows_ptr, max_rows, D, stride_win, stride_rows,
                          BLOCK_R, BLOCK_D, W_FP4_E4M3, W_NQ, W_BLOCK, W_TAIL_OFF, W_SCALE_OFF, W_HAS_TAIL)
    elif pid < win_programs + cmp_programs:
        _unpack_used_rows(pid - win_programs, cmp_ptr, n_cmp_rows, n_win_rows, ends_ptr, rows_ptr, max_rows, D,
                          stride_cmp, stride_rows, BLOCK_R, BLOCK_D, C_FP4_E4M3, C_NQ, C_BLOCK, C_TAIL_OFF,
                          C_SCALE_OFF, C_HAS_TAIL)
    else:
        _renumber_columns(pid - win_programs - cmp_programs, cols_ptr, counts_ptr, ends_ptr, out_cols_ptr, T, C,
                          n_window, n_win_rows, max_rows, stride_ct, HAS_COUNTS, BLOCK_E)


def pool_constexprs(prefix: str, fmt, dim: int) -> dict:
    """`row_constexprs` of one pool's format under the kernel's names (prefix "W_" / "C_")."""
    return {prefix + k.removeprefix("PK_"): v for k, v in row_constexprs(fmt, dim).items()}


def unpack_referenced_rows_triton(win_pool, cmp_pool, cols, n_window, fmt, dim, dtype, counts, max_rows,
                                  launch=None, cmp_fmt=None):
    """Launch the compaction (see the module docstring); max_rows >= 1; launch: entries replacing
    COMPACT_CONFIG's (a sweep's candidates); cmp_fmt: the compressed rows' format (None: fmt)."""
    cfg = dict(COMPACT_CONFIG, **(launch or {}))
    block_e = cfg["BLOCK_E"]
    cmp_fmt = fmt if cmp_fmt is None else cmp_fmt
    formats = pool_constexprs("W_", fmt, dim) | pool_constexprs("C_", cmp_fmt, dim)  # refuses what it cannot decode
    T, C = cols.shape
    n_w, n_c = win_pool.shape[0], cmp_pool.shape[0]
    if T * C >= 2**31 - block_e or n_w + n_c >= 2**31:
        raise ValueError(f"the compaction kernels number columns and rows in int32: [{T}, {C}] columns, "
                         f"{n_w + n_c} rows")
    device = cols.device
    if cols.stride(1) != 1:
        cols = cols.contiguous()
    win = win_pool if n_w else cmp_pool  # an empty pool still needs a valid pointer (never read)
    cmp = cmp_pool if n_c else win
    used = torch.zeros(n_w + n_c, dtype=torch.int32, device=device)
    rows = torch.empty(max_rows, dim, dtype=dtype, device=device)
    renumbered = torch.empty(T, C, dtype=torch.int32, device=device)
    if T * C == 0 or n_w + n_c == 0:
        return rows, renumbered.fill_(-1)
    ct = cols if counts is None else counts.reshape(T)
    has_counts = counts is not None
    col_programs = triton.cdiv(T * C, block_e)
    _flag_used_rows_kernel[(col_programs,)](
        cols, ct, used, T, C, n_window, n_w, cols.stride(0), HAS_COUNTS=has_counts, BLOCK_E=block_e,
        SKIP_SEEN=cfg["SKIP_SEEN"], num_warps=4)
    ends = torch.cumsum(used, 0, dtype=torch.int32)
    win_programs, cmp_programs = triton.cdiv(n_w, BLOCK_R), triton.cdiv(n_c, BLOCK_R)
    _unpack_and_renumber_kernel[(win_programs + cmp_programs + col_programs,)](
        win, cmp, ends, rows, cols, ct, renumbered,
        n_w, n_c, max_rows, T, C, n_window, dim, win.stride(0), cmp.stride(0), rows.stride(0), cols.stride(0),
        win_programs, cmp_programs,
        HAS_COUNTS=has_counts, BLOCK_R=BLOCK_R, BLOCK_D=max(row_block_d(fmt, dim), row_block_d(cmp_fmt, dim)),
        BLOCK_E=block_e, num_warps=4, **formats,
    )
    return rows, renumbered
