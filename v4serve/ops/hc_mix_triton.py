"""Triton kernel of the mHC mixer input (math: hc_mix_reference.py).

    mixes[t, m] = sum_k fn[m, k] x[t, k],   row_scale[t] = rsqrt(sum_k x[t, k]^2 / K + eps)   (fp32)

Layouts: x [T, K] bf16 or fp32 (row stride `stride_x`, unit column stride); fn [M, K] fp32
contiguous (M = (2 + n) n = 24 in V4, or n for the head); outputs mixes [T, M] and row_scale [T],
fp32, contiguous.

One launch replaces the cast, square, mean, rsqrt and cuBLAS fp32 GEMV kernels. Grid
(cdiv(T, BLOCK_T), n_splits): a program owns BLOCK_T tokens and one range of K (split-K, so a
decode step's 1.5 MB of fn spreads over ~128 programs). It multiplies its [BLOCK_T, BLOCK_K] tile
of x by the [BLOCK_M, BLOCK_K] tile of fn with an fp32 `tl.dot` in IEEE precision (no TF32: the
mixes feed a 20-round Sinkhorn) and sums x^2 on the way. With one split it writes the outputs;
otherwise it writes its partial row [BLOCK_M] (mixes, then the sum of squares in column M) to
`part [T, n_splits, BLOCK_M]`, and the last program of the token block to finish (an int32 ticket
per block, atomic acq_rel, reset to 0 after) sums the partials in split order (deterministic) and
writes the outputs.

Coefficients epilogue (COEFFS, op hc_stream_coefficients.py): whoever writes a token block's mixes
(the last split program, or the program itself without a split) then turns them into the
sublayer's pre, post and C (hc_coefficients_triton.coefficients_of_tokens, the standalone
kernel's code: the same bits), after a barrier that makes the block's stores visible to every
thread of the program: one launch fewer per sublayer.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.hc_coefficients_triton import coefficients_of_tokens
from v4serve.ops.hc_head_pre_triton import head_pre_of_tokens


# Production tiles: small T (decode) spreads K over ~TARGET_PROGRAMS programs; large T (prefill)
# takes wider token blocks so fn is re-read less.
HC_MIX_CONFIGS = {
    # Decode: 2 warps over 64-wide K blocks, 128 programs (H200, Triton 3.6, session-4 sweep of
    # 48 tiles): 6.4 / 10.9 / 25.4 µs at T = 1 / 8 / 64 against 8.0 / 12.5 / 30.3 for the previous
    # 4 warps over 128-wide blocks; 4 or 8 warps lose at every K width.
    "decode": dict(BLOCK_T=16, BLOCK_K=64, num_warps=2),
    "prefill": dict(BLOCK_T=32, BLOCK_K=64, num_warps=4),
}
PREFILL_FROM_T = 256
TARGET_PROGRAMS = 128


@triton.jit
def _hc_mix_kernel(
    x_ptr, fn_ptr, part_ptr, mix_ptr, row_scale_ptr, ticket_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr,
    T, K, M, k_per_split, n_splits, eps, stride_x,
    BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    SPLIT: tl.constexpr, PDL: tl.constexpr = False,
    COEFFS: tl.constexpr = False, N: tl.constexpr = 1, ITERS: tl.constexpr = 1, HC_EPS: tl.constexpr = 0.0,
    COEFF_T: tl.constexpr = 16, HEAD_PRE: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    block = tl.program_id(0)
    split = tl.program_id(1)
    t = block * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < T
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    acc = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T], dtype=tl.float32)
    k_start = split * k_per_split
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        k_ok = k < K
        x = tl.load(x_ptr + t.to(tl.int64)[:, None] * stride_x + k[None, :],
                    mask=t_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        w = tl.load(fn_ptr + m[:, None] * K + k[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        sq += tl.sum(x * x, axis=1)
    finish_mix(acc, sq, t, t_ok, m, m_ok, block, split, part_ptr, mix_ptr, row_scale_ptr, ticket_ptr, base_ptr,
               scale_ptr, pre_ptr, post_ptr, comb_ptr, T, K, M, n_splits, eps, BLOCK_T, BLOCK_M, BLOCK_S, SPLIT,
               COEFFS, N, ITERS, HC_EPS, COEFF_T, HEAD_PRE)


@triton.jit
def finish_mix(acc, sq, t, t_ok, m, m_ok, block, split, part_ptr, mix_ptr, row_scale_ptr, ticket_ptr, base_ptr,
               scale_ptr, pre_ptr, post_ptr, comb_ptr, T, K, M, n_splits, eps,
               BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, SPLIT: tl.constexpr,
               COEFFS: tl.constexpr, N: tl.constexpr, ITERS: tl.constexpr, HC_EPS: tl.constexpr,
               COEFF_T: tl.constexpr, HEAD_PRE: tl.constexpr):
    """After a program's K range: its partial row (acc [BLOCK_T, BLOCK_M] mixes, sq [BLOCK_T] sums of
    squares) to the split reduction, whose last program writes the block's mixes and RMS factors and
    runs the epilogue; without a split, straight to the outputs (any mixer kernel's tail)."""
    if SPLIT:
        part = tl.where(m[None, :] == M, sq[:, None], acc)  # column M carries the sum of squares
        part_rows = part_ptr + (t.to(tl.int64)[:, None] * n_splits + split) * BLOCK_M + m[None, :]
        tl.store(part_rows, part, mask=t_ok[:, None])
        # The barrier orders the whole program's stores before the ticket; acq_rel publishes them
        # (release) and makes the other programs' partials visible to the last one (acquire).
        tl.debug_barrier()
        ticket_at = ticket_ptr + block
        ticket = tl.atomic_add(ticket_at, 1, sem="acq_rel")
        if ticket == n_splits - 1:
            s = tl.arange(0, BLOCK_S)
            for i in range(0, tl.minimum(BLOCK_T, T - block * BLOCK_T)):
                row = (block * BLOCK_T + i).to(tl.int64)
                tile = tl.load(part_ptr + (row * n_splits + s[:, None]) * BLOCK_M + m[None, :],
                               mask=(s < n_splits)[:, None], other=0.0, cache_modifier=".cg")
                total = tl.sum(tile, axis=0)
                sum_sq = tl.sum(tl.where(m == M, total, 0.0), axis=0)
                tl.store(mix_ptr + row * M + m, total, mask=m_ok)
                tl.store(row_scale_ptr + row, tl.rsqrt(sum_sq / K + eps))
            tl.atomic_xchg(ticket_at, 0)  # ready for the next launch (graph replays too)
            _epilogue(mix_ptr, row_scale_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, block, T, M,
                      BLOCK_T, COEFFS, N, ITERS, HC_EPS, COEFF_T, HEAD_PRE)
    else:
        tl.store(mix_ptr + t.to(tl.int64)[:, None] * M + m[None, :], acc, mask=t_ok[:, None] & m_ok[None, :])
        tl.store(row_scale_ptr + t, tl.rsqrt(sq / K + eps), mask=t_ok)
        _epilogue(mix_ptr, row_scale_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, block, T, M,
                  BLOCK_T, COEFFS, N, ITERS, HC_EPS, COEFF_T, HEAD_PRE)


@triton.jit
def _epilogue(mix_ptr, row_scale_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr, block, T, M,
              BLOCK_T: tl.constexpr, COEFFS: tl.constexpr, N: tl.constexpr, ITERS: tl.constexpr,
              HC_EPS: tl.constexpr, COEFF_T: tl.constexpr, HEAD_PRE: tl.constexpr):
    """The token block's coefficients (COEFFS: COEFF_T tokens at a time, only as many sub-blocks as
    the block has live tokens) or the head's pre (HEAD_PRE), from the mixes this program wrote."""
    if COEFFS or HEAD_PRE:
        tl.debug_barrier()  # the block's mixes and RMS factors, stored above, visible to every thread
        first = block * BLOCK_T
        for s in range(first, tl.minimum(first + BLOCK_T, T), COEFF_T):
            t = s + tl.arange(0, COEFF_T)
            t_ok = t < T
            if COEFFS:
                coefficients_of_tokens(mix_ptr, row_scale_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr,
                                       t, t_ok, M, N, ITERS, HC_EPS, COEFF_T)
            else:
                head_pre_of_tokens(mix_ptr, row_scale_ptr, base_ptr, scale_ptr, pre_ptr, t, t_ok, N, HC_EPS)


def tile_config(T: int, K: int, target_programs: int = TARGET_PROGRAMS) -> dict:
    """The production tiles for T tokens, with the split of K (n_splits ranges of k_per_split) and
    the epilogue's token sub-block COEFF_T: the next power of two of T, 2 to BLOCK_T (its bits do not
    depend on it; fewer tokens a thread, shorter serial Sinkhorn chains)."""
    cfg = dict(HC_MIX_CONFIGS["prefill" if T >= PREFILL_FROM_T else "decode"])
    k_blocks = triton.cdiv(K, cfg["BLOCK_K"])
    wanted = max(1, min(k_blocks, target_programs // triton.cdiv(T, cfg["BLOCK_T"])))
    k_per_split = triton.cdiv(k_blocks, wanted) * cfg["BLOCK_K"]
    coeff_t = min(cfg["BLOCK_T"], max(2, triton.next_power_of_2(T)))
    return dict(cfg, k_per_split=k_per_split, n_splits=triton.cdiv(K, k_per_split), COEFF_T=coeff_t)


def hc_mix_triton(x: torch.Tensor, fn: torch.Tensor, eps: float, tickets: torch.Tensor | None = None,
                  config=None, coefficients: dict | None = None, head: dict | None = None) -> tuple[torch.Tensor, ...]:
    """(mixes, row_scale); with `coefficients` (base, scale fp32 contiguous, n, iters, hc_eps: the
    COEFFS epilogue) also (pre, post, comb); with `head` (base [M], scale [1] fp32 contiguous, hc_eps:
    the HEAD_PRE epilogue) also pre [T, M]. `config`: tile_config's keys (a sweep's variant)."""
    T, K = x.shape
    M = fn.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    fn = fn.contiguous()
    mixes = torch.empty(T, M, dtype=torch.float32, device=x.device)
    row_scale = torch.empty(T, dtype=torch.float32, device=x.device)
    epilogue, outs = {}, (mixes, row_scale)
    coefficient_ptrs = (mixes,) * 5  # base, scale, pre, post, comb: unused without an epilogue
    if coefficients is not None:
        n = coefficients["n"]
        pre, post = (torch.empty(T, n, dtype=torch.float32, device=x.device) for _ in range(2))
        comb = torch.empty(T, n, n, dtype=torch.float32, device=x.device)
        outs += (pre, post, comb)
        coefficient_ptrs = (coefficients["base"], coefficients["scale"], pre, post, comb)
        epilogue = dict(COEFFS=True, N=n, ITERS=coefficients["iters"], HC_EPS=coefficients["hc_eps"])
    elif head is not None:
        pre = torch.empty(T, M, dtype=torch.float32, device=x.device)
        outs += (pre,)
        coefficient_ptrs = (head["base"], head["scale"], pre, pre, pre)
        epilogue = dict(HEAD_PRE=True, N=M, HC_EPS=head["hc_eps"])
    if T == 0:
        return outs
    cfg = dict(tile_config(T, K) if config is None else config)
    k_per_split, n_splits = cfg.pop("k_per_split"), cfg.pop("n_splits")
    cfg.setdefault("COEFF_T", cfg["BLOCK_T"])
    if cfg["COEFF_T"] > cfg["BLOCK_T"]:
        raise ValueError(f"COEFF_T {cfg['COEFF_T']} must divide BLOCK_T {cfg['BLOCK_T']}")
    block_m = max(16, triton.next_power_of_2(M + 1))  # room for the sum of squares in column M
    n_blocks = triton.cdiv(T, cfg["BLOCK_T"])
    split = n_splits > 1
    part = torch.empty(T, n_splits, block_m, dtype=torch.float32, device=x.device) if split else mixes
    ticket = row_scale
    if split:  # zeroed counters, left zeroed by the kernel: the caller's buffer, else a fresh one
        fits = tickets is not None and tickets.numel() >= n_blocks and tickets.dtype == torch.int32
        ticket = tickets if fits else torch.zeros(n_blocks, dtype=torch.int32, device=x.device)
    _hc_mix_kernel[(n_blocks, n_splits)](
        x, fn, part, mixes, row_scale, ticket, *coefficient_ptrs, T, K, M, k_per_split, n_splits, eps, x.stride(0),
        BLOCK_M=block_m, BLOCK_S=triton.next_power_of_2(n_splits), SPLIT=split, **cfg, **pdl_launch(x), **epilogue,
    )
    return outs
