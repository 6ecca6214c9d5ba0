"""Triton kernel of the indexer's top-k (math: index_topk_reference.py): the first k entries of a
stable descending sort of each fp32 score row, without sorting the row.

Keys. A score s (fp32, never NaN; -0.0 is first made +0.0, which torch.sort holds equal to it)
maps to an int32 `hi` whose signed order is the score order (bits = s's bits; hi = bits for
s >= 0, bits ^ 0x7fffffff for s < 0; -inf -> -2139095041 > INT32_MIN), and an element of column c
to the int64 key

    key = hi << 32 | (~c as uint32)           (signed compare = score desc, then column asc)

Every key of a row is distinct, so "the k largest keys, largest first" is exactly the stable
sort's first k (ties to the lower column, -inf last in column order). INT64_MIN (hi = INT32_MIN)
is below every key: the padding of a short buffer.

One program does, over its columns [lo, end) of a row (n = end - lo, m = min(k, n) picks):
1. Radix select of the m-th largest hi: four passes over the columns, one 8-bit digit of
   u = hi ^ INT32_MIN (the unsigned image) each, most significant first: a 256-bin histogram of
   the digit among the columns whose higher digits equal the prefix found so far, then the bin
   where the count from the top reaches the picks still needed. After pass 4: the threshold v and
   `need` = how many columns of hi == v belong to the picks (>= 1).
2. Compaction: one more pass keeps every column with hi > v and the first `need` columns with
   hi == v (a running count in column order: the lower columns), writing their keys in column
   order to out[0:m] (exclusive prefix sums; INT64_MIN pads out[m:k]).
3. FINAL: after a barrier, the k keys are read back into one power-of-two block (KP >= k lanes,
   INT64_MIN padding), sorted descending (tl.sort, bitonic), and written as columns (~low word),
   with values gathered from the scores at those columns; MARK writes -1 for a -inf value.

Short rows (SORT_ALL, production up to SORT_ALL_RULE_COLUMNS): one program sorts all T keys of its
row in one block of next_power_of_2(T) lanes and writes the first k (no select; the bitonic sort's
cost grows as T log^2 T, the select's as T).

Schedules (`topk_splits`):
- one launch, grid (B,): a program per row runs 1-3 over all T columns (FINAL);
- two launches when a row is long and the rows few: grid (B, P), program p runs 1-2 over columns
  [p * chunk, (p + 1) * chunk) into ws[b, p, 0:k]; then grid (B,), FROM_KEYS, runs 1-3 over the
  P * k keys of ws[b] (padding included). Exact: a key among the row's k largest has fewer than
  k larger keys in its own chunk, so it is among its chunk's picks; ws[b] holds the chunks' picks
  in column order, so "the first `need` of hi == v" is again the lowest columns.

Live bound (LIVE, `n_live`): where the caller knows that a row's columns from n_live[b] on score
-inf (the decode step: a sequence's scores past its visible compressed rows, over a static cache
width T that CUDA graphs fix at max_model_len / ratio), the program works on the columns
[0, n) only, n = min(T, max(n_live[b], k)). Exact: in the stable descending order every column
below n_live comes before every -inf column past it, and those come in column order, so the k
first are all among the first max(n_live, k) columns. When n <= KS the row's first program
sorts those n columns whole (as SORT_ALL, in KS lanes) and writes the picks: in the one-launch
schedule that is the row's only program; in the split schedule the other chunks' programs and the
merge's program (which read n_live and decide the same) return at once. Otherwise the one-launch
schedule selects over [0, n), the split schedule's chunks stop at n (a chunk past it writes only
padding), and the merge reads only the cdiv(n, chunk) chunks below n (`chunk` is then the first
launch's chunk width, not the merge's span): every pick lies there. A short context costs its own
length, not the cache width (H200: B1 T32768 k512 with 540 live columns 8.2 µs against 41.6 for
the whole row; docs/performance.md, session 17).

Layouts: scores [B, T] fp32 (row stride stride_sb, unit column stride); ws [B, P, k] int64;
scratch [B, k] int64 (the FINAL program's picks before the sort); n_live [B] int32; values
[B, k] fp32 and columns [B, k] int64 (row strides stride_vb, stride_cb). Reads: the T scores 5 times (the first
from HBM, then L1 / L2), writes 8 bytes a pick.
"""

import math

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

# A program's columns per loop step and its warps (8 columns a thread).
BLOCK, NUM_WARPS = 2048, 8
# The split rule: split a row only into chunks of at least max(SPLIT_COLUMNS, 4 k) columns, into
# at most ROW_PROGRAMS programs over all rows (the H200 has 132 SMs), and at most sqrt(T / k) (the
# merge reads P * k keys: P * k <= T / P).
SPLIT_COLUMNS, ROW_PROGRAMS = 4096, 128
# The sort-everything schedule: rows up to SORT_ALL_COLUMNS columns; production up to
# SORT_ALL_RULE_COLUMNS (H200, session 16, `kernel_configs 'index topk'`, k 512: T 1024 7.35 µs
# against the select's 13.17 and torch.sort's 20.27; T 2048 27.96 against 13.45).
SORT_ALL_COLUMNS, SORT_ALL_RULE_COLUMNS = 4096, 1024


def topk_splits(rows: int, T: int, k: int) -> int:
    """Programs per row of the first launch (1: the one-launch schedule)."""
    if k <= 0 or T <= 0:
        return 1
    splits = min(T // max(SPLIT_COLUMNS, 4 * k), ROW_PROGRAMS // max(rows, 1), math.isqrt(T // k))
    return splits if splits >= 2 else 1


@triton.jit
def _row_keys(src_ptr, pos, live, FROM_KEYS: tl.constexpr):
    """(hi int32, key int64) of the entries at `pos` (the columns, or ws positions); dead lanes
    (`live` false) get hi = INT32_MIN, so keys below every real key (INT64_MIN when read from ws)."""
    if FROM_KEYS:
        key = tl.load(src_ptr + pos, mask=live, other=-9223372036854775808)
        hi = (key >> 32).to(tl.int32)
    else:
        s = tl.load(src_ptr + pos, mask=live, other=0.0)
        s = tl.where(s == 0.0, 0.0, s)  # -0.0 -> +0.0: torch.sort holds them equal
        bits = s.to(tl.int32, bitcast=True)
        hi = bits ^ ((bits >> 31) & 0x7FFFFFFF)
        hi = tl.where(live, hi, -2147483648)
        low = (~pos.to(tl.int32)).to(tl.uint32).to(tl.int64)  # ~column, zero-extended
        key = (hi.to(tl.int64) << 32) | low
    return hi, key


@triton.jit
def _write_picks(picks, score_ptr, val_ptr, col_ptr, b, stride_sb, stride_vb, stride_cb, K, KP: tl.constexpr,
                 MARK: tl.constexpr, WRITE_VALUES: tl.constexpr):
    """Sort KP keys (the picks, INT64_MIN padding) descending; write the first K as columns (-1 for a
    -inf value under MARK) and their scores, into row b of the outputs. The row pointers are formed
    here, where they are used: formed at the kernel's start they stayed in registers through the
    select's loops, and the merge with the live bound spilled 8 B under Triton 3.6."""
    ranks = tl.arange(0, KP)
    picks = tl.sort(picks, descending=True)
    column = ~(picks.to(tl.int32))
    written = ranks < K
    score_row = score_ptr + b * stride_sb
    val_row = val_ptr + b * stride_vb
    col_row = col_ptr + b * stride_cb
    value = tl.load(score_row + column, mask=written, other=0.0)
    if WRITE_VALUES:
        tl.store(val_row + ranks, value, mask=written)
    if MARK:
        column = tl.where(value == float("-inf"), -1, column)
    tl.store(col_row + ranks, column.to(tl.int64), mask=written)


@triton.jit
def _sort_all(src, n, score_ptr, val_ptr, col_ptr, b, stride_sb, stride_vb, stride_cb, K, LANES: tl.constexpr,
              MARK: tl.constexpr, WRITE_VALUES: tl.constexpr):
    """The k first of the row's n first columns (n <= LANES): every key sorted in one block."""
    ranks = tl.arange(0, LANES)
    all_hi, all_keys = _row_keys(src, ranks, ranks < n, False)
    _write_picks(all_keys, score_ptr, val_ptr, col_ptr, b, stride_sb, stride_vb, stride_cb, K, LANES, MARK,
                 WRITE_VALUES)


@triton.jit
def _select(src, out_ptr, b, n_split, p, lo, end, score_ptr, val_ptr, col_ptr, stride_sb, stride_vb, stride_cb, K,
            FROM_KEYS: tl.constexpr, FINAL: tl.constexpr, MARK: tl.constexpr, WRITE_VALUES: tl.constexpr,
            BLOCK: tl.constexpr, KP: tl.constexpr):
    """Steps 1-2 (and 3 when FINAL) of the module docstring over the columns [lo, end) of row b,
    chunk p of n_split, the picks' keys to out [B, n_split, K]."""
    m = tl.minimum(K, end - lo)
    out = out_ptr + (b * n_split + p) * K
    lanes = tl.arange(0, BLOCK)
    bins = tl.arange(0, 256)

    # 1. radix select of the m-th largest hi (u = hi ^ INT32_MIN, 8 bits a pass, high digit first)
    prefix = tl.full([], 0, tl.int32)
    need = m
    for step in tl.static_range(4):
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(lo, end, BLOCK):
            pos = start + lanes
            live = pos < end
            hi, unused_key = _row_keys(src, pos, live, FROM_KEYS)
            u = hi ^ -2147483648
            if step == 0:
                match = live
            else:  # the digits above this one equal the prefix's
                match = live & ((u >> (32 - 8 * step)) == (prefix >> (32 - 8 * step)))
            hist += tl.histogram((u >> (24 - 8 * step)) & 255, 256, mask=match)
        above = tl.sum(hist, 0) - tl.cumsum(hist, 0)  # matching entries in the bins above each bin
        digit = tl.max(tl.where(above + hist >= need, bins, 0), 0)
        need -= tl.sum(tl.where(bins > digit, hist, 0), 0)
        prefix = prefix | (digit << (24 - 8 * step))
    v = prefix ^ -2147483648  # the threshold, as a hi

    # 2. compaction: hi > v, and the first `need` of hi == v, in column order
    seen = tl.full([], 0, tl.int32)
    taken = tl.full([], 0, tl.int32)
    for start in range(lo, end, BLOCK):
        pos = start + lanes
        live = pos < end
        hi, key = _row_keys(src, pos, live, FROM_KEYS)
        eq = (live & (hi == v)).to(tl.int32)
        keep = (live & (hi > v)) | ((eq != 0) & (seen + tl.cumsum(eq, 0) - eq < need))
        kept = keep.to(tl.int32)
        tl.store(out + taken + tl.cumsum(kept, 0) - kept, key, mask=keep)
        seen += tl.sum(eq, 0)
        taken += tl.sum(kept, 0)

    if not FINAL:
        for start in range(m, K, BLOCK):  # pad a short chunk's picks
            pad = start + lanes
            tl.store(out + pad, tl.full([BLOCK], -9223372036854775808, tl.int64), mask=pad < K)
    else:
        # 3. sort the k picks (keys are distinct), write columns and values
        tl.debug_barrier()  # the compaction's stores are visible to every thread of the program
        ranks = tl.arange(0, KP)
        picks = tl.load(out + ranks, mask=ranks < K, other=-9223372036854775808)
        _write_picks(picks, score_ptr, val_ptr, col_ptr, b, stride_sb, stride_vb, stride_cb, K, KP, MARK, WRITE_VALUES)


# `live_ptr` and `n_row` come last: placed before `n_cols` they shifted the other parameters'
# offsets, and Triton 3.8's ptxas then spilled 8 B in the (otherwise unchanged) split kernel.
@triton.jit
def _index_topk_kernel(src_ptr, score_ptr, out_ptr, val_ptr, col_ptr, n_cols, K, chunk,
                       stride_sb, stride_vb, stride_cb, live_ptr, n_row,
                       FROM_KEYS: tl.constexpr, FINAL: tl.constexpr, MARK: tl.constexpr,
                       WRITE_VALUES: tl.constexpr, BLOCK: tl.constexpr, KP: tl.constexpr,
                       SORT_ALL: tl.constexpr = False, LIVE: tl.constexpr = False, KS: tl.constexpr = 1,
                       PDL: tl.constexpr = False):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    b = tl.program_id(0).to(tl.int64)
    p = tl.program_id(1)
    n_split = tl.num_programs(1)
    if FROM_KEYS:
        src = src_ptr + b * n_cols  # ws[b]: n_cols = P * k keys
    else:
        src = src_ptr + b * stride_sb
    n = n_cols  # the entries this program may read: columns, or ws keys (FROM_KEYS)
    short = False
    if LIVE:  # the live bound (module docstring): no pick lies past max(n_live, K) of the row's n_row
        live = tl.minimum(n_row, tl.maximum(tl.load(live_ptr + b), K))
        short = live <= KS
        if FROM_KEYS:  # the merge: only the chunks that hold live columns (`chunk`: their width)
            n = tl.minimum(n_cols, tl.cdiv(live, chunk) * K)
        else:
            n = live
    if SORT_ALL:  # the variant for short rows (KP >= n_cols): sort every key of the row, no select
        _sort_all(src, n, score_ptr, val_ptr, col_ptr, b, stride_sb, stride_vb, stride_cb, K, KP, MARK,
                  WRITE_VALUES)
    elif short:  # a live prefix of at most KS columns: the row's first program sorts it whole
        if not FROM_KEYS and p == 0:
            _sort_all(src, n, score_ptr, val_ptr, col_ptr, b, stride_sb, stride_vb, stride_cb, K, KS, MARK,
                      WRITE_VALUES)
    else:
        lo = p * chunk
        if LIVE and FROM_KEYS:
            end = n
        else:
            end = tl.minimum(lo + chunk, n)
            if LIVE:
                end = tl.maximum(lo, end)  # a chunk past the live prefix: no column
        _select(src, out_ptr, b, n_split, p, lo, end, score_ptr, val_ptr, col_ptr, stride_sb, stride_vb, stride_cb,
                K, FROM_KEYS, FINAL, MARK, WRITE_VALUES, BLOCK, KP)


def index_topk_triton(scores: torch.Tensor, k: int, mark_masked: bool = False, splits: int | None = None,
                      block: int = BLOCK, num_warps: int = NUM_WARPS, write_values: bool = True,
                      sort_all: bool | None = None, n_live: torch.Tensor | None = None,
                      live_sort_lanes: int = SORT_ALL_RULE_COLUMNS) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(values [..., k] fp32 or None, columns [..., k] int64) of scores [..., T] fp32, 0 <= k <= T;
    mark_masked: -1 for a -inf pick. splits None: `topk_splits`; block: the loop step (a power of
    two >= 256, tests use small ones). sort_all: sort all T keys in one block of next_power_of_2(T)
    lanes (short rows only: T <= SORT_ALL_COLUMNS), no select; None: the production rule (sort all
    up to SORT_ALL_RULE_COLUMNS unless a split is asked for). n_live: int32 [...] (scores' leading
    shape), the caller's promise that row b scores -inf from column n_live[b] on (the module
    docstring's live bound; ignored by the sort-everything schedule); a live prefix of up to
    `live_sort_lanes` columns is sorted whole (a power of two, SORT_ALL_COLUMNS at most; tests use
    small ones)."""
    T = scores.shape[-1]
    if sort_all is None:
        sort_all = splits is None and T <= SORT_ALL_RULE_COLUMNS
    lead = scores.shape[:-1]
    if scores.dtype != torch.float32:
        raise ValueError(f"scores must be fp32, got {scores.dtype}")
    if not 0 <= k <= T:
        raise ValueError(f"k must be in [0, T = {T}], got {k}")
    if n_live is not None and (n_live.dtype != torch.int32 or n_live.shape != lead):
        raise ValueError(f"n_live must be int32 {tuple(lead)}, got {n_live.dtype} {tuple(n_live.shape)}")
    rows = scores.reshape(-1, T)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    B = rows.shape[0]
    dev = scores.device
    values = torch.empty(B, k, dtype=torch.float32, device=dev) if write_values else None
    columns = torch.empty(B, k, dtype=torch.int64, device=dev)
    if B == 0 or k == 0:
        return (None if values is None else values.reshape(*lead, k)), columns.reshape(*lead, k)
    vals = values if write_values else columns  # a placeholder pointer when no values are written
    stride_v = values.stride(0) if write_values else 0
    live = n_live.reshape(B).contiguous() if n_live is not None else columns  # a placeholder without LIVE
    common = dict(MARK=mark_masked, WRITE_VALUES=write_values, BLOCK=block, num_warps=num_warps, **pdl_launch(rows))
    if sort_all:
        if T > SORT_ALL_COLUMNS:
            raise ValueError(f"sort_all sorts rows of at most {SORT_ALL_COLUMNS} columns, got {T}")
        _index_topk_kernel[(B, 1)](rows, rows, columns, vals, columns, T, k, T, rows.stride(0), stride_v,
                                   columns.stride(0), live, T, FROM_KEYS=False, FINAL=True,
                                   KP=triton.next_power_of_2(T), SORT_ALL=True, **common)
        return (None if values is None else values.reshape(*lead, k)), columns.reshape(*lead, k)
    P = topk_splits(B, T, k) if splits is None else max(1, min(splits, T))
    chunk = triton.cdiv(triton.cdiv(T, P), block) * block
    P = triton.cdiv(T, chunk)
    scratch = torch.empty(B, k, dtype=torch.int64, device=dev)
    common.update(KP=triton.next_power_of_2(k))
    if n_live is not None:
        # Sorting a live prefix whole needs its k picks in the block: lanes >= k (else never: n >= k).
        lanes = live_sort_lanes if live_sort_lanes >= k else 1
        if lanes > SORT_ALL_COLUMNS or lanes & (lanes - 1):
            raise ValueError(f"live_sort_lanes must be a power of two <= {SORT_ALL_COLUMNS}, got {live_sort_lanes}")
        common.update(LIVE=True, KS=lanes)
    if P == 1:
        _index_topk_kernel[(B, 1)](rows, rows, scratch, vals, columns, T, k, chunk, rows.stride(0), stride_v,
                                   columns.stride(0), live, T, FROM_KEYS=False, FINAL=True, **common)
    else:
        ws = torch.empty(B, P, k, dtype=torch.int64, device=dev)
        _index_topk_kernel[(B, P)](rows, rows, ws, vals, columns, T, k, chunk, rows.stride(0), stride_v,
                                   columns.stride(0), live, T, FROM_KEYS=False, FINAL=False, **common)
        # The merge's span: P * k keys; with the live bound it reads the first launch's chunk
        # width instead and merges only the chunks below the live prefix.
        span = chunk if n_live is not None else P * k
        _index_topk_kernel[(B, 1)](ws, rows, scratch, vals, columns, P * k, k, span, rows.stride(0), stride_v,
                                   columns.stride(0), live, T, FROM_KEYS=True, FINAL=True, **common)
    return (None if values is None else values.reshape(*lead, k)), columns.reshape(*lead, k)
