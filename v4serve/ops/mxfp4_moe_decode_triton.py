"""Triton kernel of the MXFP4 MoE layer at decode without the pick sort: one GEMV program per
(pick, BLOCK_N output columns) that reads its expert id straight from the router's output, and
optionally the combine done by the last program of a token's output tile to arrive.

Why: with one pick a program (`gemv_picks` = 1: every decode batch up to 0.75 E picks) the sort
only told each program its expert (the GEMV's `group_block` scans the 256 group ends, a cumsum and
four reductions, before its first weight load can be addressed). Here program p loads
experts[p] (one scalar) and its activation row directly, so the layer is route, gate_up, down,
combine: the sort launch and two 256-wide scans a program are gone, the bytes are the same.

Math, per pick p = t * TOP_K + i of token t (expert e = experts[p]), exactly the production GEMV's
with one pick a program (mxfp4_gemv_triton.py, whose device functions this kernel calls in the
same order with the same tiles, so every row of y has the same bits):

    gate_up (SWIGLU):  h[p, n] = clamped_swiglu(round(x[t] . W13[e, n]), round(x[t] . W13[e, I + n]))
    down:              y[p, n] = round(h[p] . W2[e, n])

y is in pick order (the sorted path's row pos[p]); the combine reads row p where moe_combine reads
row pos[p]. SKIP_PAST_ROWS (a layer split over passes, model/quantized_offload.py, whose other
passes' picks carry an id past the weight's rows): program p with experts[p] >= n_rows (the
weight's leading dim) returns once it has read the id, no weight read, no store, so row p of y
keeps what another pass wrote there (production's resident launch, False, has no such test).
With COMBINE (down only), after storing its y tile each program takes a ticket for (token t,
column tile) (int32 atomic, acq_rel, gpu scope); the TOP_K-th to arrive adds the token's picks in
slot order, as moe_combine_triton does, and leaves the ticket at zero:

    out[t, n] = round(sum_{i = 0..TOP_K-1} w[t, i] * y[t TOP_K + i, n])   (fp32, slot order)
    out[t, n] = round(out[t, n] + add[t, n])                                (HAS_ADD)

Layouts: x [T, K] (gate_up) or h [T TOP_K, K] (down) bf16 / fp16 / fp32, unit stride along K;
weight uint8 [E, N_W, K/2] read as int32 words, scale uint8 [E, N_W, K/32] (see
mxfp4_gemv_triton.py); experts [T TOP_K] int32 / int64 contiguous, every id < E (the router's);
y [T TOP_K, N]; COMBINE: w [T, TOP_K] fp32 contiguous, add [T, N] (row stride stride_a), out
[T, N] contiguous, arrivals int32 zeros [T cdiv(N, BLOCK_N)] that the caller keeps.
Grid (T TOP_K, cdiv(N, BLOCK_N)).
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch
from v4serve.ops.moe_combine_triton import combine_columns
from v4serve.ops.mxfp4_gemv_triton import _accumulate, _decode, _load_step, _pick_x, _store_pick, _x_words, gemv_config


@triton.jit
def _mxfp4_moe_pick_kernel(
    x_ptr, w_ptr, s_ptr, experts_ptr, y_ptr, cw_ptr, add_ptr, out_ptr, arrivals_ptr,
    N, K, K_SCALES, stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_y, stride_a, limit, n_rows,
    TOP_K: tl.constexpr, X_PER_TOKEN: tl.constexpr, X_WORDS: tl.constexpr, DECODE_ASM: tl.constexpr,
    SWIGLU: tl.constexpr, EVEN_K: tl.constexpr, COMBINE: tl.constexpr, HAS_ADD: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, AHEAD: tl.constexpr = 1, EARLY: tl.constexpr = False,
    SKIP_PAST_ROWS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """stride_we / stride_wn in int32 words, the rest in elements. X_PER_TOKEN: x has a row per
    token (gate_up: row p // TOP_K), else one per pick (down: row p). AHEAD: K steps whose weights
    are in flight while one is decoded (1: production's register double buffer; 2: one more
    buffer). EARLY (down only, under PDL): the expert id and the first AHEAD steps' weights are
    loaded before the wait (they come from the router, two launches back, and from the weights:
    not from the launch being waited for). SKIP_PAST_ROWS: a pick whose expert id is >= n_rows
    (the weight's leading dim) computes and stores nothing."""
    if PDL and not EARLY:
        gdc_wait()
    pick = tl.program_id(0)
    e = tl.load(experts_ptr + pick, cache_modifier=".cg").to(tl.int64)  # L2: with EARLY read before the wait
    if SKIP_PAST_ROWS:
        if e >= n_rows:  # no weight row to read: its row of y keeps what it holds
            if PDL and EARLY:
                gdc_wait()  # leave after the launch before, as the computing programs do
            return
    row = (pick // TOP_K if X_PER_TOKEN else pick).to(tl.int64)
    valid = pick >= 0  # a true scalar: the production kernel's `n_valid > 0` for its one pick
    KW: tl.constexpr = BLOCK_K // 8
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    w_rows = w_ptr.to(tl.pointer_type(tl.int32)) + e * stride_we + offs_n.to(tl.int64)[:, None] * stride_wn
    s_rows = s_ptr + e * stride_se + offs_n.to(tl.int64)[:, None] * stride_sn
    up_w = N * stride_wn  # SWIGLU: the up rows N..2N-1
    up_s = N * stride_sn
    k_words = K // 8
    acc = tl.zeros((BLOCK_N, KW // 4), dtype=tl.float32)
    up = tl.zeros_like(acc)
    # the production GEMV's loop with one pick (mxfp4_gemv_triton._mxfp4_gemv_kernel, PICKS = 1):
    # the same loads, decodes and FMAs in the same order; AHEAD only moves the loads earlier
    # (EVEN_K: the prefetches past the last step re-read the last step instead of masking)
    words, scale, words_up, scale_up = _load_step(w_rows, s_rows, up_w, up_s, 0, mask_n, k_words, K_SCALES,
                                                  SWIGLU, EVEN_K, KW)
    if AHEAD > 1:
        k_1 = tl.minimum(BLOCK_K, K - BLOCK_K) if EVEN_K else BLOCK_K
        words1, scale1, words_up1, scale_up1 = _load_step(w_rows, s_rows, up_w, up_s, k_1, mask_n, k_words,
                                                          K_SCALES, SWIGLU, EVEN_K, KW)
    if PDL and EARLY:
        gdc_wait()  # h comes from the launch before this one
    for k0 in range(0, K, BLOCK_K):
        k_next = tl.minimum(k0 + AHEAD * BLOCK_K, K - BLOCK_K) if EVEN_K else k0 + AHEAD * BLOCK_K
        next_words, next_scale, next_words_up, next_scale_up = _load_step(
            w_rows, s_rows, up_w, up_s, k_next, mask_n, k_words, K_SCALES, SWIGLU, EVEN_K, KW)
        d = _decode(words, DECODE_ASM)
        xs = _pick_x(x_ptr, row, valid, stride_x, k0, K, X_WORDS, EVEN_K, KW)
        acc = _accumulate(acc, d, xs, scale, KW, BLOCK_N)
        if SWIGLU:
            d_up = _decode(words_up, DECODE_ASM)
            up = _accumulate(up, d_up, xs, scale_up, KW, BLOCK_N)
        if AHEAD > 1:
            words, scale, words_up, scale_up = words1, scale1, words_up1, scale_up1
            words1, scale1, words_up1, scale_up1 = next_words, next_scale, next_words_up, next_scale_up
        else:
            words, scale, words_up, scale_up = next_words, next_scale, next_words_up, next_scale_up
    _store_pick(y_ptr, acc, up, pick, valid, offs_n, mask_n, stride_y, limit, SWIGLU)
    if COMBINE:
        token = pick // TOP_K
        ticket = arrivals_ptr + token * tl.num_programs(1) + tl.program_id(1)
        tl.debug_barrier()  # every thread's y tile is stored before the (release) arrival
        arrived = tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu")
        if arrived == TOP_K - 1:
            # moe_combine_triton's sum, y in pick order, read from L2 (other programs wrote it)
            combine_columns(y_ptr, y_ptr, cw_ptr, add_ptr, out_ptr, token, offs_n, mask_n, N, stride_y, stride_a,
                            TOP_K, False, HAS_ADD, BLOCK_N, ".cg")
            tl.store(ticket, 0)  # zero again for the next launch (a graph replay too)


def pick_rows(y: torch.Tensor | None, picks: int, n: int, x: torch.Tensor) -> torch.Tensor:
    """The [picks, n] output of a decode projection: `y` when given (checked: x's dtype and
    device, unit stride along n), else a new tensor."""
    if y is None:
        return torch.empty(picks, n, dtype=x.dtype, device=x.device)
    if y.shape != (picks, n) or y.dtype != x.dtype or y.device != x.device or y.stride(1) != 1:
        raise ValueError(f"y must be [{picks}, {n}] {x.dtype} on {x.device} with unit stride along N, got "
                         f"{y.dtype} {tuple(y.shape)} on {y.device}, strides {y.stride()}")
    return y


def combine_tiles(n: int, config: dict | None = None) -> int:
    """Output column tiles of the down projection (one arrival ticket each per token)."""
    return triton.cdiv(n, (config or gemv_config(1, False))["BLOCK_N"])


def mxfp4_moe_pick_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, experts: torch.Tensor,
                          top_k: int, per_token: bool, config: dict | None = None, swiglu_limit: float | None = None,
                          decode: str | None = None, combine: tuple | None = None, y: torch.Tensor | None = None,
                          skip_past_rows: bool = False):
    """One projection of the decode MoE, a program per (pick, column tile), expert ids read from
    `experts` [P] (P = T top_k, pick order). `per_token`: x [T, K] (row p // top_k), else x [P, K].
    Returns y [P, N] (N = N_W / 2 with `swiglu_limit`), in pick order. `config` BLOCK_N, BLOCK_K,
    num_warps, num_stages (default: the production GEMV's one-pick tiles, `gemv_config(1, swiglu)`),
    optionally AHEAD (1 / 2 K steps of weights in flight) and EARLY (x per pick only: the weights
    before the PDL wait); bench variants (bench/moe_configs.py), the bits do not depend on them.

    `combine` = (weights [T, top_k] fp32, add [T, N] or None, arrivals int32 zeros [>= T tiles]):
    the down projection also does moe_combine (pick order) and returns out [T, N] instead.

    `y`: the [P, N] tensor to write (x's dtype, unit stride along N; default a new one).
    `skip_past_rows`: the picks whose expert id is >= E (weight's leading dim) compute and store
    nothing, their rows of y keep what they held (a layer split over passes, model/quantized_offload.py:
    the other passes' picks carry id E); not with `combine`."""
    e, n_w, half_k = weight.shape
    k = 2 * half_k
    if k % 32 or weight.data_ptr() % 16 or weight.stride(1) % 16 or weight.stride(0) % 16:
        raise ValueError("the GEMV kernel reads weight rows as 16-byte words: K % 32 == 0 and 16-byte aligned rows")
    if experts.dim() != 1 or not experts.is_contiguous():
        raise ValueError(f"experts must be contiguous [P], got {tuple(experts.shape)}")
    swiglu = swiglu_limit is not None
    if swiglu and combine is not None:
        raise ValueError("the combine follows the down projection, not the SwiGLU one")
    if skip_past_rows and combine is not None:
        raise ValueError("the combine needs every pick of a token: no skipped picks")
    n = n_w // 2 if swiglu else n_w
    picks = experts.shape[0]
    cfg = config or gemv_config(1, swiglu)
    decode = decode or ("asm" if compiled_on_cuda(x.device) else "bits")
    y = pick_rows(y, picks, n, x)
    tiles = triton.cdiv(n, cfg["BLOCK_N"])
    out = y
    weights = add = arrivals = y
    if combine is not None:
        weights, add, arrivals = combine
        tokens = picks // top_k
        if weights.shape != (tokens, top_k) or weights.dtype != torch.float32 or not weights.is_contiguous():
            raise ValueError(f"weights must be contiguous fp32 [{tokens}, {top_k}], got {weights.dtype} "
                             f"{tuple(weights.shape)}")
        if arrivals.dtype != torch.int32 or arrivals.numel() < tokens * tiles or not arrivals.is_contiguous():
            raise ValueError(f"arrivals must be contiguous int32 zeros [>= {tokens * tiles}], got {arrivals.dtype} "
                             f"[{arrivals.numel()}]")
        out = torch.empty(tokens, n, dtype=x.dtype, device=x.device)
    has_add = add is not None and combine is not None
    if add is None:
        add = y
    elif add.stride(1) != 1:
        add = add.contiguous()
    if picks == 0:
        return out
    _mxfp4_moe_pick_kernel[(picks, tiles)](
        x, weight, scale, experts, y, weights, add, out, arrivals,
        n, k, k // 32, x.stride(0), weight.stride(0) // 4, weight.stride(1) // 4, scale.stride(0), scale.stride(1),
        y.stride(0), add.stride(0), float(swiglu_limit) if swiglu else 0.0, e,
        TOP_K=top_k, X_PER_TOKEN=per_token, X_WORDS=_x_words(x), DECODE_ASM=decode == "asm", SWIGLU=swiglu,
        EVEN_K=k % cfg["BLOCK_K"] == 0, COMBINE=combine is not None, HAS_ADD=has_add,
        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], AHEAD=cfg.get("AHEAD", 1),
        EARLY=cfg.get("EARLY", False) and not per_token, SKIP_PAST_ROWS=skip_past_rows,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_launch(x),
    )
    return out
