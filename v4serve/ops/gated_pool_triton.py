"""Triton kernel of the gated pool (math: gated_pool_reference.py).

    out[b, d] = sum_r kv[b, r, d] * softmax_r(score[b, :, d])        fp32 math

Layouts: kv, score [B, R, D] with any strides (fp32 or bf16); out [B, D] contiguous, bf16 or fp32.
Grid (B, cdiv(D, BLOCK_D)): a program owns BLOCK_D columns of one output row and reads its
[BLOCK_R, BLOCK_D] tiles of kv and score in one load each, so R = 128 is one wide load per
program, not a walk over rows; R > BLOCK_R continues with an online softmax (running max, sum,
weighted sum). BLOCK_D is picked per shape so that even B = 1, D = 512 spreads over 64 programs.
The running max starts at -3e38, not -inf, so a tile of -inf scores adds weight 0 instead of NaN.
"""

import torch
import triton
import triton.language as tl

MAX_TILE_ELEMENTS = 4096


def tile_config(B: int, R: int, D: int) -> dict:
    """Production tiles (H200 sweep): narrow column blocks when B * D is small, so that enough
    programs run (B1 D512: 64 programs of 8 columns); one warp when the tile is a few rows."""
    block_d = max(8, min(128, triton.next_power_of_2(max(1, B * D // 256))))
    block_r = max(1, min(triton.next_power_of_2(R), MAX_TILE_ELEMENTS // block_d))
    return dict(BLOCK_R=block_r, BLOCK_D=block_d, num_warps=1 if block_r <= 8 else 4)


@triton.jit
def _gated_pool_kernel(
    kv_ptr, score_ptr, out_ptr,
    R, D,
    stride_kb, stride_kr, stride_kd, stride_sb, stride_sr, stride_sd, stride_ob,
    BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dim_ok = dims < D
    m = tl.full([BLOCK_D], -3.0e38, dtype=tl.float32)
    denom = tl.zeros([BLOCK_D], dtype=tl.float32)
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for r0 in range(0, R, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        ok = (rows < R)[:, None] & dim_ok[None, :]
        s = tl.load(score_ptr + b * stride_sb + rows[:, None] * stride_sr + dims[None, :] * stride_sd,
                    mask=ok, other=float("-inf")).to(tl.float32)
        kv = tl.load(kv_ptr + b * stride_kb + rows[:, None] * stride_kr + dims[None, :] * stride_kd,
                     mask=ok, other=0.0).to(tl.float32)
        m_new = tl.maximum(m, tl.max(s, 0))
        alpha = tl.exp(m - m_new)
        e = tl.exp(s - m_new[None, :])
        denom = denom * alpha + tl.sum(e, 0)
        acc = acc * alpha + tl.sum(e * kv, 0)
        m = m_new
    tl.store(out_ptr + b * stride_ob + dims, (acc / denom).to(out_ptr.dtype.element_ty), mask=dim_ok)


def gated_pool_triton(kv: torch.Tensor, score: torch.Tensor, out_dtype: torch.dtype, config=None) -> torch.Tensor:
    B, R, D = kv.shape
    out = torch.empty(B, D, dtype=out_dtype, device=kv.device)
    if B == 0 or D == 0:
        return out
    cfg = tile_config(B, R, D) if config is None else config
    _gated_pool_kernel[(B, triton.cdiv(D, cfg["BLOCK_D"]))](
        kv, score, out, R, D,
        *kv.stride(), *score.stride(), out.stride(0),
        **cfg,
    )
    return out
