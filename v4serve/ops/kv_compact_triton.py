"""Triton kernels of the row compaction (math: kv_compact.py), with no host sync.

Layouts. win_pool / cmp_pool uint8 [N_w | N_c, >= row_bytes] packed fp8 rows (ue8m0 formats,
byte layout in kv_pack_triton.py), 16-byte aligned rows sharing one row stride; cols int32 [T, C]
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
4. `_unpack_and_renumber_kernel`:     one launch, two kinds of program. The first
                                      cdiv(N_w + N_c, BLOCK_R) programs each look at BLOCK_R rows
                                      (row g is used where ends[g] != ends[g - 1]) and unpack the
                                      used ones (slot < R) into rows[slot] (16-byte loads of codes,
                                      scale bytes read as int32 words: kv_pack_triton.load_packed);
                                      the rest rewrite BLOCK_E columns each: slot or -1.
Columns are read as int32 words over the flattened [T, C] table (t = e // C), once in 2 and once in
4; the flag and slot tables are small and stay in L2.
"""

import torch
import triton
import triton.language as tl

from v4serve.ops.kv_pack_triton import load_packed, packed_constexprs

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
def _unpack_used_rows(block, win_ptr, cmp_ptr, ends_ptr, rows_ptr, n_win_rows, n_pool_rows, max_rows, D,
                      stride_pool, stride_rows, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
                      PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr,
                      PK_SCALE_OFF: tl.constexpr, PK_HAS_TAIL: tl.constexpr):
    """Pool rows [block * BLOCK_R, +BLOCK_R): each used one (slot < max_rows) unpacked into rows[slot]."""
    g = block.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    inside = g < n_pool_rows
    end = tl.load(ends_ptr + g, mask=inside, other=0)
    used = end != tl.load(ends_ptr + g - 1, mask=inside & (g > 0), other=0)  # used[g] = ends[g] - ends[g - 1]
    slot = end.to(tl.int64) - 1
    take = inside & used & (slot < max_rows)
    if tl.max(take.to(tl.int32), 0) > 0:
        # NOTE: the hint keeps the gather at 16-byte loads (Triton >= 3.8 loses the alignment of a select).
        in_window = g < n_win_rows
        base = tl.multiple_of(tl.where(in_window, win_ptr, cmp_ptr), 16)
        src = base + tl.where(in_window, g, g - n_win_rows) * stride_pool
        v = load_packed(src, take, 0, D, BLOCK_D, PK_NQ, PK_BLOCK, PK_TAIL_OFF, PK_SCALE_OFF, PK_HAS_TAIL,
                        rows_ptr.dtype.element_ty)
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
    n_win_rows, n_pool_rows, max_rows, T, C, n_window, D, stride_pool, stride_rows, stride_ct,
    unpack_programs,
    HAS_COUNTS: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    PK_NQ: tl.constexpr, PK_BLOCK: tl.constexpr, PK_TAIL_OFF: tl.constexpr, PK_SCALE_OFF: tl.constexpr,
    PK_HAS_TAIL: tl.constexpr,
):
    pid = tl.program_id(0)
    if pid < unpack_programs:
        _unpack_used_rows(pid, win_ptr, cmp_ptr, ends_ptr, rows_ptr, n_win_rows, n_pool_rows, max_rows, D,
                          stride_pool, stride_rows, BLOCK_R, BLOCK_D, PK_NQ, PK_BLOCK, PK_TAIL_OFF,
                          PK_SCALE_OFF, PK_HAS_TAIL)
    else:
        _renumber_columns(pid - unpack_programs, cols_ptr, counts_ptr, ends_ptr, out_cols_ptr, T, C, n_window,
                          n_win_rows, max_rows, stride_ct, HAS_COUNTS, BLOCK_E)


def unpack_referenced_rows_triton(win_pool, cmp_pool, cols, n_window, fmt, dim, dtype, counts, max_rows,
                                  launch=None):
    """Launch the compaction (see the module docstring); max_rows >= 1; launch: entries replacing
    COMPACT_CONFIG's (a sweep's candidates)."""
    cfg = dict(COMPACT_CONFIG, **(launch or {}))
    block_e = cfg["BLOCK_E"]
    if fmt.value_bits != 8:
        raise ValueError(f"the compaction kernels unpack fp8 rows, not {fmt.name}")
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
    if win.stride(0) != cmp.stride(0):
        raise ValueError(f"win_pool and cmp_pool must share a row stride, got {win.stride(0)} and {cmp.stride(0)}")
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
    pk = packed_constexprs(fmt, dim)
    pk.pop("PK_FP4"), pk.pop("PK_PAYLOAD"), pk.pop("PK_ROW_BYTES")
    unpack_programs = triton.cdiv(n_w + n_c, BLOCK_R)
    _unpack_and_renumber_kernel[(unpack_programs + col_programs,)](
        win, cmp, ends, rows, cols, ct, renumbered,
        n_w, n_w + n_c, max_rows, T, C, n_window, dim, win.stride(0), rows.stride(0), cols.stride(0),
        unpack_programs,
        HAS_COUNTS=has_counts, BLOCK_R=BLOCK_R, BLOCK_D=max(triton.next_power_of_2(dim), fmt.block), BLOCK_E=block_e,
        num_warps=4, **pk,
    )
    return rows, renumbered
