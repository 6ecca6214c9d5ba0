"""The V4.1 indexer's streaming kernel: decode steps and candidate mode (math: v41_index_reference.py,
contract: v41_index.py, the rounding steps and their bits: v41_index_triton.py).

    l[t, h]  = bf16(k[t] . q[h])                    one MMA per tile, keys as its rows (M), heads as N
    p[t, h]  = bf16(relu(l[t, h]) * w[h])
    score[t] = bf16(sum_h p[t, h])                   the head sum runs along the accumulator's columns
                                                     (in-thread adds, then 2 shuffles in a quad)

Grid (P programs per query row, S, B). A program owns one query and every P-th tile of BLOCK_T
output columns (slots) from its first (strided, so that a candidate list's empty tail, skipped, is
shared by all P programs); it loads q^T [D, BLOCK_H] and w once, then streams its tiles. Each tile is
a chain of dependent loads:

    candidate mode:  block ids (cand[b, s, c // 8]) -> key_rows[b, col] -> the key row's words
    full mode:                                          key_rows[b, c]   -> the key row's words

and the loop keeps every stage a tile ahead of the next: while tile i is decoded and scored, the
words of tile i + 1, the key_rows entries of tile i + 2 and the block ids of tile i + 3 are in
flight (each load's result is first touched one iteration after it was issued, so a program pays
the chain's latency once, not once per tile). A slot is live when its block is listed, its
column is below n_visible and below R, and its key row is not a hole; the rest score -inf. The
key_rows load is masked only to stay inside the row (n_visible is applied after it: in full mode
the chain is then key_rows -> words, not n_visible -> key_rows -> words), and the packed key words
are loaded unmasked, a slot that is not live reading pool row 0 (its score is -inf whatever it
reads): no per-slot mask crosses from the slots' layout into the words' layout on the chain.
With EARLY_CHAIN (production; contract in v41_stream_scores) the candidate list and key_rows loads of
the first tiles are issued before griddepcontrol.wait, overlapping the end of the kernel launched
before this one; q, w and the first words are issued together after it. With TRIGGER (production)
every program calls griddepcontrol.launch_dependents right after that wait: the kernel launched after
this one may start its own pre-wait work while this one scores, not only once its last program
exits (its wait still waits for this whole grid). SPLIT_STORE (production) writes a tile's scores and
its dead slots' -inf with two disjointly masked stores in the slots' layout, so that no liveness
tensor is moved into the scores' layout (an exchange through shared memory and two barriers a tile).
Empty tiles (SKIP_EMPTY, candidate prefill): SKIP_BY_LIST (production) finds them from the tile's own
BLOCK_T / 8 list entries, loaded a tile ahead and reduced within each warp; otherwise from its slots'
key rows, a max across the warpgroup (three more barriers a tile).

Keys (PACKED): `fp4_e8m0_b32` rows of int32 words (D = 128: 16 code words, 1 scale word; layout
in v41_index_triton.py), decoded exactly to bf16 by fp4_words_triton.decode_fp4_words, two channels
per packed bf16 multiply, in that function's pair column order; q^T's rows are put in the same
order once per program (to_pair_order), so the dot sums the same products. Otherwise bf16 rows
[N, D] gathered with 16-byte loads: key_rows[b, col] of a bf16 pool, or (PREDECODED) row
b * R + col of the sequence's keys decoded once per step (`_v41_decode_keys_kernel`; there the
key_rows entry only says whether the row is a hole, so the gather does not wait for it).

Weights: bf16 [B, S, H] read as int32 words (two heads a word, H even), split into fp32 with a
shift and a mask (exact): no fp32 copy is made on the host (one launch fewer in a decode step).

Bits: the logits and products are the reference's bits (v41_index_triton.py); the head sum is
fp32 in the reduction's order: equal to the reference where the sum is exact, within one bf16 ulp
+ 2 (H - 1) 2^-24 sum_h |p| elsewhere (the same bound as the other kernels).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch, sm_count
from v4serve.ops.fp4_words_triton import decode_fp4_words, to_pair_order
from v4serve.ops.v41_index_triton import _v41_decode_keys_kernel

# Production: 128 slots per tile on one warpgroup (two wgmma m64n32 row blocks), about two programs
# per SM, each streaming its share of the tiles (a decode step's 128-1024 tiles: 1-4 tiles a program).
# Per 64 slots the loop is ~430 SASS instructions at 128-slot tiles against ~550-610 at 64 (the
# per-slot index / mask work runs on tensors replicated over the warpgroup: half the replication),
# 142-150 registers (sm_90, Triton 3.6-3.9); 256-slot tiles need 255 registers and save nothing.
# bench/v41_index_configs.py times other tile sizes, warps and programs per SM beside it.
STREAM_CONFIG = dict(BLOCK_T=128, PROGRAMS_PER_SM=2, num_warps=4, num_stages=1)
# A candidate-mode prefill chunk (thousands of tiles a step): 8 programs per SM (3 resident at 142-150
# registers, the rest in later waves), each with fewer tiles: 3-4% faster than 2 per SM on the H200
# (session 11's sweep: 75.8 vs 79.0 µs at n128 start8064, 119.1 vs 122.3 at start130944).
STREAM_CONFIG_CAND_PREFILL = dict(STREAM_CONFIG, PROGRAMS_PER_SM=8)
# mma.sync GPUs (sm_80, sm_89, sm_120): 64-slot tiles (128 spilled 8 B on sm_120 under Triton 3.8 / 3.9).
STREAM_CONFIG_MMA_SYNC = dict(BLOCK_T=64, PROGRAMS_PER_SM=2, num_warps=4, num_stages=1)
DECODE_ROWS = 32  # rows per program of the predecode kernel


@triton.jit
def _bf16_pairs_to_fp32(words):
    """int32 [N] words of two bf16 values each (element 2i in the low half) -> fp32 [2N], exactly."""
    lo = (words << 16).to(tl.float32, bitcast=True)
    hi = (words & -65536).to(tl.float32, bitcast=True)
    return tl.reshape(tl.join(lo, hi), (2 * words.shape[0],))


# Two heads of one key a call (pack=2): $2, $3 the logits (fp32), $4 the two bf16 weights, $0, $1 the
# rounded products as fp32. cvt packs bf16(l) two to a register (upper half from the first operand),
# max applies relu (of the rounded logit: the same value), the fma with a -0 addend is the product
# rounded once (exact product of two bf16; "rn" so that ptxas may not contract it into the sum), and
# shifting / masking the halves gives each product as an fp32.
_PRODUCTS_ASM = tl.constexpr(
    "{\n.reg .b32 t, zero, neg_zero, lo;\n"
    "mov.b32 zero, 0;\n"
    "mov.b32 neg_zero, 0x80008000;\n"
    "cvt.rn.bf16x2.f32 t, $3, $2;\n"
    "max.bf16x2 t, t, zero;\n"
    "fma.rn.bf16x2 t, t, $4, neg_zero;\n"
    "shl.b32 lo, t, 16;\n"
    "mov.b32 $0, lo;\n"
    "and.b32 t, t, 0xffff0000;\n"
    "mov.b32 $1, t;\n}"
)


@triton.jit
def _head_sum(logits, w, PACKED_MATH: tl.constexpr):
    """fp32 [BLOCK_T] sum_h bf16(relu(bf16(logits[:, h])) * w[h]) (w bf16 [BLOCK_H]), the reference's
    roundings. PACKED_MATH (compiled CUDA): two heads an instruction (_PRODUCTS_ASM); else in fp32
    (relu before the rounding: the same value, rounding is monotonic; the fp32 product of two bf16
    values is exact, so rounding it once is the bf16 product). Not bf16 arithmetic in Triton: PTX
    lets ptxas contract a bf16 multiply without a rounding modifier into the fp32 sum (FFMA, one
    rounding fewer), which it did on sm_90."""
    if PACKED_MATH:
        p = tl.inline_asm_elementwise(_PRODUCTS_ASM, "=f,=f,f,f,r",
                                      [logits, tl.broadcast_to(w[None, :], logits.shape)],
                                      dtype=tl.float32, is_pure=True, pack=2)
    else:
        relu = tl.maximum(logits, 0.0).to(tl.bfloat16).to(tl.float32)
        p = (relu * w.to(tl.float32)[None, :]).to(tl.bfloat16).to(tl.float32)
    return tl.sum(p, 1)


@triton.jit
def _block_ids(cand_at, tile, C, BLOCK_T: tl.constexpr, CAND_BLOCK: tl.constexpr, CANDIDATES: tl.constexpr):
    """Stage 1 of a tile: the block id of each slot (candidate mode: a load; -1 past C, so a tile past the
    program's last one loads nothing), or in full mode the column itself (no load)."""
    c = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    if CANDIDATES:
        ids = tl.load(cand_at + c // CAND_BLOCK, mask=c < C, other=-1)
    else:
        ids = tl.where(c < C, c, -1)
    return ids


@triton.jit
def _listed_blocks(cand_at, tile, C, BLOCK_T: tl.constexpr, CAND_BLOCK: tl.constexpr):
    """The tile's BLOCK_T / CAND_BLOCK candidate-list entries (-1 past C): few enough that every warp
    holds all of them, so that their max (is any block listed?) is a reduction within each warp, with no
    exchange between the warps (the max over the tile's slots crosses them: shared memory, barriers)."""
    NB: tl.constexpr = BLOCK_T // CAND_BLOCK
    j = tile * NB + tl.arange(0, NB)
    return tl.load(cand_at + j, mask=j * CAND_BLOCK < C, other=-1)


@triton.jit
def _columns(ids, BLOCK_T: tl.constexpr, CAND_BLOCK: tl.constexpr, CANDIDATES: tl.constexpr):
    """The key column of each slot from its stage-1 ids (negative where nothing is listed)."""
    if CANDIDATES:
        col = tl.where(ids >= 0, ids * CAND_BLOCK + tl.arange(0, BLOCK_T) % CAND_BLOCK, -1)
    else:
        col = ids
    return col


@triton.jit
def _key_rows(rows_at, ids, n_visible, R, BLOCK_T: tl.constexpr, CAND_BLOCK: tl.constexpr,
              CANDIDATES: tl.constexpr):
    """Stage 2: key_rows[b, col] of the live columns, -1 for every slot that is not live (not listed,
    at or past n_visible or R, or a hole): `rows >= 0` is the slot's liveness from here on. The load's
    mask is only what keeps it inside the row (listed, below R); n_visible is applied after it, so that
    the load does not wait for n_visible's (full mode: one dependent load fewer before the key words)."""
    col = _columns(ids, BLOCK_T, CAND_BLOCK, CANDIDATES)
    rows = tl.load(rows_at + col, mask=(col >= 0) & (col < R), other=-1)
    return tl.where(col < n_visible, rows, -1)


@triton.jit
def _key_data(k_ptr, rows, ids, seq_row0, stride_k, D: tl.constexpr, BLOCK_T: tl.constexpr,
              CAND_BLOCK: tl.constexpr, CANDIDATES: tl.constexpr, PACKED: tl.constexpr, PREDECODED: tl.constexpr):
    """Stage 3: the tile's key data, zeros where not live. PACKED: (code words int32 [BLOCK_T, D / 8],
    scale word int32 [BLOCK_T]); else (bf16 keys [BLOCK_T, D], the rows again as a placeholder)."""
    live = rows >= 0
    if PACKED:
        # Unmasked: a slot that is not live reads pool row 0 (an empty pool gets a stand-in row:
        # _key_pool_words) and its score is replaced by -inf after the MMA, whatever its words decode to. A mask
        # would be one more per-slot tensor moved into the words' layout (through shared memory, a
        # barrier) on the chain from key_rows to the words, and a predicate a load.
        NW: tl.constexpr = D // 8
        row_at = k_ptr + tl.maximum(rows, 0).to(tl.int64) * stride_k
        wc = tl.arange(0, NW)
        codes = tl.load(row_at[:, None] + wc[None, :])
        if NW <= 16:  # one scale word a row (D <= 128): [BLOCK_T]
            scales = tl.load(row_at + NW)
        else:  # code word i's scale word NW + i // 16: [BLOCK_T, NW]
            scales = tl.load(row_at[:, None] + (NW + wc // 16)[None, :])
        return codes, scales
    else:
        if PREDECODED:  # the sequence's decoded rows: the address needs the column, not key_rows
            row = seq_row0 + _columns(ids, BLOCK_T, CAND_BLOCK, CANDIDATES).to(tl.int64)
        else:
            row = rows.to(tl.int64)
        d = tl.arange(0, D)
        keys = tl.load(k_ptr + row[:, None] * stride_k + d[None, :], mask=live[:, None], other=0.0)
        return keys, rows


@triton.jit
def _score_tile(data, scales, rows, q_t, w, out_at, tile, C, D: tl.constexpr, BLOCK_T: tl.constexpr,
                PACKED: tl.constexpr, PACKED_MATH: tl.constexpr, SPLIT_STORE: tl.constexpr = False):
    """Decode (PACKED), one MMA keys [BLOCK_T, D] x q^T [D, BLOCK_H], weighted relu, head sum, store."""
    if PACKED:
        if D <= 128:
            keys = decode_fp4_words(data, tl.broadcast_to(scales[:, None], data.shape), D)
        else:
            keys = decode_fp4_words(data, scales, D)
    else:
        keys = data
    score = _head_sum(tl.dot(keys, q_t), w, PACKED_MATH)
    c = tile * BLOCK_T + tl.arange(0, BLOCK_T)
    if SPLIT_STORE:
        tl.store(out_at + c, score.to(tl.bfloat16), mask=(c < C) & (rows >= 0))
        tl.store(out_at + c, tl.full([BLOCK_T], float("-inf"), tl.float32).to(tl.bfloat16), mask=(c < C) & (rows < 0))
    else:
        tl.store(out_at + c, tl.where(rows >= 0, score, float("-inf")).to(tl.bfloat16), mask=c < C)


@triton.jit
def _v41_scores_stream_kernel(
    q_ptr, w_ptr, k_ptr, rows_ptr, n_visible_ptr, cand_ptr, out_ptr,
    H, R, C,
    stride_qb, stride_qs, stride_qh, stride_wb, stride_ws, stride_k, stride_rb, stride_nb,
    stride_cb, stride_cs, stride_ob, stride_os,
    D: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_T: tl.constexpr, CAND_BLOCK: tl.constexpr,
    CANDIDATES: tl.constexpr, PACKED: tl.constexpr, PREDECODED: tl.constexpr, SKIP_EMPTY: tl.constexpr,
    PACKED_MATH: tl.constexpr, PDL: tl.constexpr = False, EARLY_CHAIN: tl.constexpr = False,
    SPLIT_STORE: tl.constexpr = False, TRIGGER: tl.constexpr = False, SKIP_BY_LIST: tl.constexpr = False,
):
    if PDL and not EARLY_CHAIN:
        gdc_wait()
        if TRIGGER:
            gdc_launch_dependents()
    s = tl.program_id(1).to(tl.int64)
    b = tl.program_id(2).to(tl.int64)
    first = tl.program_id(0)  # this program's tiles: first, first + step, first + 2 step, ...
    step = tl.num_programs(0)  # (strided: a candidate list's empty tail is spread over the programs)
    n_visible = tl.load(n_visible_ptr + b * stride_nb + s)
    rows_at = rows_ptr + b * stride_rb
    cand_at = cand_ptr + b * stride_cb + s * stride_cs
    out_at = out_ptr + b * stride_ob + s * stride_os
    seq_row0 = b * R  # PREDECODED: the sequence's first decoded row
    # the first tiles' chains, each stage issued as soon as the one it needs is
    ids2 = _block_ids(cand_at, first + 2 * step, C, BLOCK_T, CAND_BLOCK, CANDIDATES)
    ids1 = _block_ids(cand_at, first + step, C, BLOCK_T, CAND_BLOCK, CANDIDATES)
    ids0 = _block_ids(cand_at, first, C, BLOCK_T, CAND_BLOCK, CANDIDATES)
    if SKIP_BY_LIST:
        listed0 = _listed_blocks(cand_at, first, C, BLOCK_T, CAND_BLOCK)
    if EARLY_CHAIN:  # stages 1-2 before griddepcontrol.wait (the contract: v41_stream_scores' early_chain)
        rows0 = _key_rows(rows_at, ids0, n_visible, R, BLOCK_T, CAND_BLOCK, CANDIDATES)
        rows1 = _key_rows(rows_at, ids1, n_visible, R, BLOCK_T, CAND_BLOCK, CANDIDATES)
        if PDL:
            gdc_wait()
            if TRIGGER:
                gdc_launch_dependents()
    # q^T and w beside the first loads (used only by the first MMA)
    heads = tl.arange(0, BLOCK_H)
    d = tl.arange(0, D)
    q_t = tl.load(q_ptr + b * stride_qb + s * stride_qs + heads[None, :] * stride_qh + d[:, None],
                  mask=(heads < H)[None, :], other=0.0)  # [D, BLOCK_H]
    if EARLY_CHAIN:  # the first words beside q (both after the wait; the decode waits for the words only)
        data0, scales0 = _key_data(k_ptr, rows0, ids0, seq_row0, stride_k, D, BLOCK_T, CAND_BLOCK, CANDIDATES,
                                   PACKED, PREDECODED)
    if PACKED:
        q_t = to_pair_order(q_t, D)
    pairs = tl.arange(0, BLOCK_H // 2)
    w = _bf16_pairs_to_fp32(tl.load(w_ptr + b * stride_wb + s * stride_ws + pairs, mask=2 * pairs < H, other=0))
    w = w.to(tl.bfloat16)  # exact
    if not EARLY_CHAIN:
        rows0 = _key_rows(rows_at, ids0, n_visible, R, BLOCK_T, CAND_BLOCK, CANDIDATES)
        rows1 = _key_rows(rows_at, ids1, n_visible, R, BLOCK_T, CAND_BLOCK, CANDIDATES)
        data0, scales0 = _key_data(k_ptr, rows0, ids0, seq_row0, stride_k, D, BLOCK_T, CAND_BLOCK, CANDIDATES,
                                   PACKED, PREDECODED)
    n_tiles = tl.cdiv(tl.cdiv(C, BLOCK_T) - first, step)
    for i in range(n_tiles):
        tile = first + i * step
        # the next tiles' loads first: their results are first used one iteration from now. The next
        # tile's words only if there is one (a uniform branch): ~140 SASS instructions and a barrier
        # that a program's last tile (a B1 decode step's only one) would spend before its decode
        if i + 1 < n_tiles:
            data1, scales1 = _key_data(k_ptr, rows1, ids1, seq_row0, stride_k, D, BLOCK_T, CAND_BLOCK, CANDIDATES,
                                       PACKED, PREDECODED)
        else:
            data1, scales1 = data0, scales0
        rows2 = _key_rows(rows_at, ids2, n_visible, R, BLOCK_T, CAND_BLOCK, CANDIDATES)
        ids3 = _block_ids(cand_at, tile + 3 * step, C, BLOCK_T, CAND_BLOCK, CANDIDATES)
        if SKIP_BY_LIST:
            listed1 = _listed_blocks(cand_at, tile + step, C, BLOCK_T, CAND_BLOCK)
        if CANDIDATES:
            if SKIP_BY_LIST:  # no block of the tile listed (a short list's -1 tail): -inf without the math
                busy = tl.max(listed0, 0) >= 0
            elif SKIP_EMPTY:  # no slot of the tile live: -inf without the math
                busy = tl.max(rows0, 0) >= 0
            else:
                busy = True
        else:  # full mode: the tile has a live column iff it starts below n_visible
            busy = tile * BLOCK_T < n_visible
        if busy:
            _score_tile(data0, scales0, rows0, q_t, w, out_at, tile, C, D, BLOCK_T, PACKED, PACKED_MATH, SPLIT_STORE)
        else:
            c = tile * BLOCK_T + tl.arange(0, BLOCK_T)
            tl.store(out_at + c, tl.full([BLOCK_T], float("-inf"), tl.float32).to(tl.bfloat16), mask=c < C)
        data0, scales0, rows0 = data1, scales1, rows1
        rows1, ids1 = rows2, ids2
        ids2 = ids3
        if SKIP_BY_LIST:
            listed0 = listed1


def stream_config(device: torch.device, candidate_prefill: bool = False) -> dict:
    """The production config for `device`: 128-slot tiles with warpgroup MMAs (sm_90, sm_100), else 64;
    on warpgroup GPUs a candidate-mode prefill chunk spreads its tiles over 8 programs per SM."""
    if compiled_on_cuda(device) and torch.cuda.get_device_capability(device)[0] in (9, 10):
        return STREAM_CONFIG_CAND_PREFILL if candidate_prefill else STREAM_CONFIG
    return STREAM_CONFIG_MMA_SYNC


def _weight_words(weights: torch.Tensor) -> torch.Tensor:
    """bf16 [B, S, H] -> int32 [B, S, ceil(H / 2)] words of two heads: a view of the model's even-H
    contiguous weights; a copy (a zero head appended when H is odd) when the rows are not word-aligned."""
    w = weights.to(torch.bfloat16)
    H = w.shape[2]
    if H % 2 or w.stride(2) != 1 or w.stride(1) % 2 or w.stride(0) % 2 or w.data_ptr() % 4:
        w = torch.nn.functional.pad(w, (0, H % 2)).contiguous()
    return w.view(torch.int32)


def programs_per_row(tiles_per_row: int, rows: int, config: dict, device: torch.device) -> int:
    """Programs that share one query's tiles (each takes every n-th tile): tiles_per_row / config["TILES"]
    if given, else about PROGRAMS_PER_SM programs per SM over all rows (one tile each when there are
    fewer tiles than that)."""
    if "TILES" in config:
        return triton.cdiv(tiles_per_row, config["TILES"])
    if not compiled_on_cuda(device):
        return tiles_per_row
    target = config["PROGRAMS_PER_SM"] * sm_count(device)
    return max(1, min(tiles_per_row, round(target / rows)))


def v41_stream_scores(q, weights, pool, key_rows, n_visible, packed, cand_blocks, cand_block, out,
                      config=None, predecode=False, skip_empty=None, early_chain=None):
    """Fill `out` bf16 [B, S, C] with the scores (the arguments as v41_index_scores_triton takes them:
    `pool` int32 words [N, 17] when packed, else bf16 [N, D]). predecode: packed keys decoded once per
    step into bf16 rows first (a prefill chunk, where each key serves many queries).

    early_chain (or config["EARLY_CHAIN"]; default on): with programmatic dependent launch, the first
    stages of the first tiles' chains (n_visible, the candidate list, key_rows) are loaded before
    griddepcontrol.wait, while the kernel launched before this one finishes; q, w and the key words
    (which this layer's compressor may just have written) are loaded after it, side by side. The
    caller guarantees that the kernel launched right before this one writes neither n_visible nor
    key_rows nor the candidate list. The model's do not: they come from the step plan and the
    candidate source, an earlier layer. (A .contiguous() copy of them in the dispatch would: it turns
    the early chain off.)

    config["TRIGGER"] (default: on when the grid has at most one program per SM): with programmatic
    dependent launch, each program calls griddepcontrol.launch_dependents right after its
    griddepcontrol.wait, so that the kernel launched after this one (if launched with PDL) starts its
    own pre-wait work while this one scores; its wait still waits for this whole grid and its memory.
    The early programs of the next kernel hold SM slots while they wait, which a grid of more than one
    wave needs: on the H200 (session 13) the three changes together took B1 decode over 128 tiles from
    2.51 / 2.67 to 2.03 / 2.04 µs (full ctx32768, candidates) but grids of 512 tiles (B4, ctx131072)
    from 5.15 / 5.42 / 5.12 to 6.03 / 6.22 / 6.00; the trigger is the change that can cost a multi-wave
    grid, so it is kept to one program per SM (not yet measured alone: `v41_index_configs`).
    config["SPLIT_STORE"] (default on): the scores and the -inf of the slots that are not live are
    written by two stores with disjoint masks in the slots' layout, instead of a select whose liveness
    operand had to be moved into the scores' layout (through shared memory, two barriers).
    config["SKIP_BY_LIST"] (default on, where empty tiles are skipped): a
    tile is skipped when none of its candidate blocks is listed, a max within each warp, instead of when
    none of its slots is live, a max across the warpgroup (3 barriers a tile); a tile with listed blocks but
    no live slot is then scored and written as -inf. All three leave every output bit as it was."""
    B, S, H, D = q.shape
    if H > 128 or D & (D - 1) or D < 32:
        raise ValueError(f"the stream kernel holds every head in one MMA tile and D as one power-of-two tile: "
                         f"H <= 128 and D a power of two >= 32, got H = {H}, D = {D}")
    R = key_rows.shape[1]
    C = out.shape[2]
    candidates = cand_blocks is not None
    cfg = dict(stream_config(q.device, candidates and S > 1) if config is None else config)
    cfg.setdefault("EARLY_CHAIN", True if early_chain is None else early_chain)
    cfg.setdefault("SPLIT_STORE", True)
    block_t = cfg.pop("BLOCK_T")
    predecoded = predecode and packed
    if predecoded:
        flat = key_rows.flatten()
        keys = torch.empty(flat.numel(), D, dtype=torch.bfloat16, device=q.device)
        _v41_decode_keys_kernel[(triton.cdiv(flat.numel(), DECODE_ROWS),)](
            pool, flat, keys, flat.numel(), pool.stride(0), D=D, BLOCK_R=DECODE_ROWS, num_warps=4)
        pool, packed = keys, False
    tiles_per_row = triton.cdiv(C, block_t)
    programs = programs_per_row(tiles_per_row, S * B, cfg, q.device)
    cfg.setdefault("TRIGGER", compiled_on_cuda(q.device) and programs * S * B <= sm_count(q.device))
    cfg.pop("TILES", None)
    cfg.pop("PROGRAMS_PER_SM", None)
    w = _weight_words(weights)
    cand = cand_blocks if candidates else key_rows  # an unused pointer in full mode
    if skip_empty is None:
        skip_empty = candidates and S > 1  # prefill chunks: short lists leave whole tiles empty
    # which test finds an empty tile: no block listed (default; within each warp) or no slot live
    per_tile = block_t // cand_block  # list entries a tile (a power of two for the per-warp load)
    cfg["SKIP_BY_LIST"] = (cfg.get("SKIP_BY_LIST", True) and candidates and skip_empty
                           and block_t % cand_block == 0 and per_tile & (per_tile - 1) == 0)
    grid = (programs, S, B)
    _v41_scores_stream_kernel[grid](
        q, w, pool, key_rows, n_visible, cand, out, H, R, C,
        q.stride(0), q.stride(1), q.stride(2), w.stride(0), w.stride(1), pool.stride(0), key_rows.stride(0),
        n_visible.stride(0), cand.stride(0), cand.stride(1) if candidates else 0, out.stride(0), out.stride(1),
        D=D, BLOCK_H=max(16, triton.next_power_of_2(H + H % 2)), BLOCK_T=block_t, CAND_BLOCK=cand_block,
        CANDIDATES=candidates, PACKED=packed, PREDECODED=predecoded, SKIP_EMPTY=skip_empty,
        PACKED_MATH=compiled_on_cuda(q.device), **cfg, **pdl_launch(q),
    )
    return out
