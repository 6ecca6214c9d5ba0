"""Random inputs shaped like the cache hands them to the kernels (shared by CPU and GPU tests)."""

import torch

from v4serve.ops.weight_formats import quantize_fp8_blocks


def sparse_attn_inputs(B, M, H, D, n_window, K, *, device="cpu", row_offset=16, hole_fraction=0.2, seed=0):
    """bf16 q and pools (pool views start `row_offset` rows into a larger buffer), idx with holes."""
    g = torch.Generator().manual_seed(seed)
    n_win, n_cmp = max(n_window, 1) * 2, max(K, 1) * 2
    buf = torch.randn(row_offset + n_win + n_cmp + 8, D, generator=g).bfloat16()
    win_pool = buf[row_offset : row_offset + n_win]
    cmp_pool = buf[row_offset + n_win : row_offset + n_win + n_cmp]
    q = torch.randn(B, M, H, D, generator=g).bfloat16()
    idx = torch.cat([torch.randint(0, n_win, (B, M, n_window), generator=g),
                     torch.randint(0, n_cmp, (B, M, K), generator=g)], -1)
    idx = torch.where(torch.rand(idx.shape, generator=g) < hole_fraction, -1, idx).to(torch.int32)
    sink = torch.randn(H, generator=g)
    counts = torch.randint(0, K + 1, (B, M), generator=g).to(torch.int32)
    to = lambda t: t.to(device)  # noqa: E731
    return to(q), to(win_pool), to(cmp_pool), to(idx), to(sink), to(counts)


def rel_err(out, ref):
    return float((out.double() - ref.double()).norm() / ref.double().norm().clamp(min=1e-30))


def fp8_linear_case(m, n, k, block, seed=0, device="cpu"):
    """An FP8 block-scaled weight [n, k] (ue8m0 scales; row magnitudes spread over 3 decades) and bf16
    activations [m, k] (channel magnitudes over 5 decades): (x, weight, scale)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    w = torch.randn(n, k, generator=gen, device=device) * torch.logspace(-2, 1, n, device=device)[:, None]
    weight, scale = quantize_fp8_blocks(w, block, "ue8m0")
    x = (torch.randn(m, k, generator=gen, device=device) * torch.logspace(-3, 2, k, device=device)).bfloat16()
    return x, weight, scale


# Issue 17's B8 variants of the two-pass decode over packed rows (kernel_configs 'fp8kv', not
# production), shared by the CPU tests (bits in the interpreter; the Gluon ones check that their
# launches fall back to the `tl` passes there) and the GPU tests. Session 14: values programs of 32
# heads on mma.sync (the tile through the bf16 operand boundary: no async-proxy fence a tile), the
# tile as the left operand of the transposed dot (out^T = kv^T p^T: wgmma reads it from registers)
# at 64 dims a program for 32 or 64 heads, the whole-tile scores pass over 4 warps (one warpgroup).
# Session 22: the values pass and the scores pass in Gluon (sm_90 only).
PACKED_B8_VARIANTS = {
    "values h32 mma.sync": dict(VALUE_BLOCK_H=32, KV_OPERAND=1),
    "values kv lhs dv64 h32": dict(BLOCK_DV=64, VALUE_BLOCK_H=32, KV_OPERAND=2),
    "values kv lhs dv64 h64": dict(BLOCK_DV=64, KV_OPERAND=2),
    "scores 4 warps": dict(SCORES=dict(num_warps=4, num_stages=1)),
    "values gluon": dict(VALUES_KERNEL="gluon"),
    "values gluon 2wg": dict(VALUES_KERNEL="gluon", VALUE_WARPGROUPS=2),
    "scores gluon": dict(SCORES_KERNEL="gluon"),
    "both gluon 2wg": dict(SCORES_KERNEL="gluon", VALUES_KERNEL="gluon", VALUE_WARPGROUPS=2),
}
