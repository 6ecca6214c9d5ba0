"""Triton kernel of the mHC expand fused with the next sublayer's mixer and coefficients (math:
hc_expand_reference.py, then hc_mix_reference.py and hc_coefficients_reference.py).

    X'[t, k, d] = round(round(post[t, k] f[t, d]) + round(sum_j comb[t, j, k] X[t, j, d]))
    then mixes, RMS factor and (pre', post', comb') of X' as hc_stream_coefficients computes them

Layouts: f [T, D] (unit stride along D, row stride `stride_ft`); X [T, N, D] (strides `stride_xt`,
`stride_xn`, unit along D); post [T, N], comb [T, N, N] fp32 contiguous; X' [T, N, D] contiguous in
X's dtype; fn [M, N D] fp32 contiguous; the mixer's outputs as hc_mix_triton.py's.

The mixer's grid and split of K = N D (hc_mix_triton.tile_config): a program owns BLOCK_T tokens
and a range of k = s D + d; for each BLOCK_K-wide block of it (BLOCK_K divides D, so a block lies
in one stream s) it computes the block of X'_s from the N streams' same channels (`expanded`, the
expand kernel's code: the same bits), stores it (every element of X' is written once, by the
program whose K range holds it), and feeds the rounded values to the mixer's dot, as the mixer
would have read them back. The split reduction and the coefficients epilogue are the mixer's
(`finish_mix`), so mixes and coefficients have the bits of hc_expand followed by
hc_stream_coefficients at the same tiles. One launch where the expand and the mixer were two; the
expand reads each stream N times (from L2 at decode sizes: 4 x 32 KB a token at V4-Flash), so the op
runs it below PREFILL_FROM_T tokens only.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch
from v4serve.ops.hc_expand_triton import expanded
from v4serve.ops.hc_mix_triton import PREFILL_FROM_T, finish_mix, tile_config


@triton.jit
def _hc_expand_mix_kernel(
    f_ptr, x_ptr, post_in_ptr, comb_in_ptr, y_ptr,
    fn_ptr, part_ptr, mix_ptr, row_scale_ptr, ticket_ptr, base_ptr, scale_ptr, pre_ptr, post_ptr, comb_ptr,
    T, D, M, k_per_split, n_splits, eps, stride_ft, stride_xt, stride_xn,
    BLOCK_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    SPLIT: tl.constexpr, N: tl.constexpr, ITERS: tl.constexpr, HC_EPS: tl.constexpr, COEFF_T: tl.constexpr,
    PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    block = tl.program_id(0)
    split = tl.program_id(1)
    K = N * D
    t = block * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < T
    rows = t.to(tl.int64)
    m = tl.arange(0, BLOCK_M)
    m_ok = m < M
    acc = tl.zeros([BLOCK_T, BLOCK_M], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T], dtype=tl.float32)
    k_start = split * k_per_split
    for k0 in range(k_start, tl.minimum(k_start + k_per_split, K), BLOCK_K):
        s = k0 // D  # the block's stream
        d = k0 - s * D + tl.arange(0, BLOCK_K)
        ok = t_ok[:, None] & (d < D)[None, :]
        post = tl.load(post_in_ptr + rows * N + s, mask=t_ok, other=0.0)
        x_new = expanded(f_ptr + rows[:, None] * stride_ft + d[None, :], ok, post[:, None],
                         (comb_in_ptr + rows * (N * N) + s)[:, None], t_ok[:, None],
                         x_ptr + rows[:, None] * stride_xt + d[None, :], ok, stride_xn, y_ptr, N)
        tl.store(y_ptr + rows[:, None] * K + s * D + d[None, :], x_new, mask=ok)
        x = x_new.to(tl.float32)
        k = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(fn_ptr + m[:, None] * K + k[None, :], mask=m_ok[:, None] & (k < K)[None, :], other=0.0)
        acc += tl.dot(x, tl.trans(w), input_precision="ieee")
        sq += tl.sum(x * x, axis=1)
    finish_mix(acc, sq, t, t_ok, m, m_ok, block, split, part_ptr, mix_ptr, row_scale_ptr, ticket_ptr, base_ptr,
               scale_ptr, pre_ptr, post_ptr, comb_ptr, T, K, M, n_splits, eps, BLOCK_T, BLOCK_M, BLOCK_S, SPLIT,
               True, N, ITERS, HC_EPS, COEFF_T, False)


def expand_mix_fits(D: int, T: int) -> bool:
    """Whether the fused kernel runs: decode sizes (the mixer's decode tiles; at prefill sizes the N
    reads of every stream would cost more HBM traffic than the launch it saves), each BLOCK_K-wide
    block of K in one stream."""
    return T < PREFILL_FROM_T and D % tile_config(T, D)["BLOCK_K"] == 0


def hc_expand_mix_triton(output: torch.Tensor, streams: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                         fn: torch.Tensor, rms_eps: float, coefficients: dict, tickets: torch.Tensor | None = None,
                         config=None) -> tuple[torch.Tensor, ...]:
    """(X', pre', post', comb'): `coefficients` as hc_mix_triton's (base, scale fp32 contiguous, n,
    iters, hc_eps); `config`: tile_config's keys."""
    T, n, D = streams.shape
    K, M = n * D, fn.shape[0]
    streams = streams if streams.stride(2) == 1 else streams.contiguous()
    output = output if output.stride(1) == 1 else output.contiguous()
    y = torch.empty(T, n, D, dtype=streams.dtype, device=streams.device)
    new_pre, new_post = (torch.empty(T, n, dtype=torch.float32, device=y.device) for _ in range(2))
    new_comb = torch.empty(T, n, n, dtype=torch.float32, device=y.device)
    if T == 0:
        return y, new_pre, new_post, new_comb
    cfg = dict(tile_config(T, K) if config is None else config)
    k_per_split, n_splits = cfg.pop("k_per_split"), cfg.pop("n_splits")
    cfg.setdefault("COEFF_T", cfg["BLOCK_T"])
    if D % cfg["BLOCK_K"] or cfg["COEFF_T"] > cfg["BLOCK_T"]:
        raise ValueError(f"BLOCK_K {cfg['BLOCK_K']} must divide D {D} and COEFF_T {cfg['COEFF_T']} BLOCK_T")
    block_m = max(16, triton.next_power_of_2(M + 1))  # room for the sum of squares in column M
    n_blocks = triton.cdiv(T, cfg["BLOCK_T"])
    split = n_splits > 1
    mixes = torch.empty(T, M, dtype=torch.float32, device=y.device)
    row_scale = torch.empty(T, dtype=torch.float32, device=y.device)
    part = torch.empty(T, n_splits, block_m, dtype=torch.float32, device=y.device) if split else mixes
    ticket = row_scale
    if split:  # zeroed counters, left zeroed by the kernel: the caller's buffer, else a fresh one
        fits = tickets is not None and tickets.numel() >= n_blocks and tickets.dtype == torch.int32
        ticket = tickets if fits else torch.zeros(n_blocks, dtype=torch.int32, device=y.device)
    _hc_expand_mix_kernel[(n_blocks, n_splits)](
        output, streams, post.float().contiguous(), comb.float().contiguous(), y,
        fn.float().contiguous(), part, mixes, row_scale, ticket, coefficients["base"], coefficients["scale"],
        new_pre, new_post, new_comb, T, D, M, k_per_split, n_splits, rms_eps, output.stride(0), streams.stride(0),
        streams.stride(1), BLOCK_M=block_m, BLOCK_S=triton.next_power_of_2(n_splits), SPLIT=split, N=n,
        ITERS=coefficients["iters"], HC_EPS=coefficients["hc_eps"], **cfg, **pdl_launch(output),
    )
    return y, new_pre, new_post, new_comb
