"""Triton kernel of the MXFP4 MoE layer at decode on tensor cores, the weights decoded straight into
the MMA's register operand (issue 18): the sort-free calling convention of mxfp4_moe_decode_triton.py
(one program per (pick, output tile), the expert id read from the router's output), with the
weight tile as the dot's LEFT operand (swap AB):

    out^T[n, c] = sum_k W[e, n, k] X[k, c],   X[:, 0] = x[row], X[:, 1..15] = 0   (MMA N = 16)

Why: the production GEMV (mxfp4_gemv_triton.py) is bound by instruction issue (~4.7 SASS
instructions a weight: an fp32 conversion and an FFMA per weight before any decode). Here a
weight costs its share of an integer decode (3 ops a bf16 pair), one bf16x2 multiply a pair
(which also applies the block scale) and 1/8 of an HGMMA; x and 15 zero columns are the MMA's
shared-memory operand, the decoded bf16 pairs its register operand (Hopper wgmma; mma.sync
elsewhere): Triton keeps the decoded tile in registers (`tt.reshape` straight to the dot operand
layout), though it re-lays the loaded bytes through shared memory first (mxfp4_moe_mma_gluon.py
does not).

Math. W[e, n, k] = e2m1(c) * 2^(b - 127), c the nibble, b = scale[e, n, k // 32]. The PTX decoder
(elementwise on bytes: each output from its own byte, so any packing Triton picks is correct)
spreads 4 bytes into the low bytes of two registers' 16-bit halves (2 prmt), then per bf16 pair:
the nibble masked, multiplied by (2^s + 2^m) so that one copy puts its sign on bit 15 / 31 and the
other its three magnitude bits on bits 8..6 / 24..22 (the copies do not overlap: no carries),
masked again: the bf16 e2m1(c) * 2^-126 exactly (the e = 0 codes land on 0 and the subnormal
2^-127); then one `fma.rn.bf16x2` by the pair 2^(b - 1) (bias field b + 126) and -0:

    w = e2m1(c) * 2^-126 * 2^(b - 1) = e2m1(c) * 2^(b - 127)     exact for 0 <= b <= 128

(both factors have <= 2 significant bits; the smallest result 2^-128 is a bf16 subnormal, which
bf16 arithmetic keeps). b > 128 (a block with |w| > 12; expert blocks sit far below) would make
2^(b - 1) overflow: `mma_scales_exact` says whether a tensor of scales qualifies, to be checked
once where the weights are loaded, never per launch. The decoded weights are exact bf16 values
and x is bf16, so every product w * x is exact in the MMA's fp32 accumulator; y differs from the
reference (fp32 products, fp32 sums in k order) only in the order of the fp32 sums (the MMA's k16
chunks): |y - ref| <= gamma_K sum_k |w x|. The low nibbles (even elements) and the high ones (odd
elements) are two dots against x's even and odd elements.

Row independence: a pick is its own program, its x in column 0, and column 0 of an MMA does not
depend on the other columns: a row of y has the same bits whatever the batch (speculative verify
= plain decoding), and whatever the grid.

Layouts: x [T, K] (gate_up, row p // TOP_K) or h [T TOP_K, K] (down, row p) bf16, unit stride
along K; weight uint8 [E, N_W, K/2] (16-byte aligned rows), scale uint8 [E, N_W, K/32]; experts
[T TOP_K] int32 / int64, every id < E; y [T TOP_K, N] bf16. SWIGLU: a program's 64 weight rows
are 32 gate rows n0..n0+31 and their 32 up rows N + n0..; it stores h = clamped_swiglu(gate, up)
for its 32 columns (gate and up rounded to bf16 first, as the unfused path stores them).
Grid (T TOP_K, cdiv(N, BLOCK_OUT)), BLOCK_OUT = 64 (down) or 32 (gate_up).

K loop (sm_90, Triton 3.6, 128 weights a thread a step): 466 SASS instructions, 3.64 a weight
(production's sort-free GEMV: 594): decode 288 (2.25), x's zero columns stored every step with
2-byte stores (37 STS), the bytes' re-layout (4 STS.128 + 4 LDSM + ~48 PRMT), 16 HGMMA + fences.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch
from v4serve.ops.mxfp4_decode_triton import four_bytes_ptx
from v4serve.ops.mxfp4_moe_decode_triton import pick_rows
from v4serve.ops.swiglu_triton import clamped_swiglu_f32

# $0, $1: the low nibbles of bytes (0, 1) and (2, 3) (elements 0, 2 and 4, 6 of the word); $2, $3:
# the high nibbles (elements 1, 3 and 5, 7); $4: 4 packed bytes; $5, $6: the scale pairs 2^(b - 1)
# of bytes (0, 1) and (2, 3). t01 / t23 hold bytes 0, 1 / 2, 3 in the low byte of each 16-bit half
# (prmt selector 4 = a zero byte). Low nibble: sign bit 3 -> 15 (x 2^12), magnitude bits 2..0 ->
# 8..6 (x 2^6); high nibble: bit 7 -> 15 (x 2^8), bits 6..4 -> 8..6 (x 2^2). Each output element
# depends on its own byte only (Triton's elementwise contract: any packing of the 4 is correct).
_DECODE_MMA_ASM = tl.constexpr(four_bytes_ptx(("$5",), ("$6",)))


@triton.jit
def scale_pair_bf16(b):
    """int32 ue8m0 bytes b <= 128 -> bf16 2^(b - 1) (bias field b + 126)."""
    return ((b + 126) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _decode_mma_asm(packed, mult):
    """uint8 bytes and bf16 2^(b - 1) of the same shape -> (low nibbles, high nibbles) bf16
    e2m1 * 2^(b - 127): the even and the odd elements."""
    return tl.inline_asm_elementwise(
        asm=_DECODE_MMA_ASM,
        constraints="=r,=r,=r,=r,r,r,r",
        args=[packed, mult],
        dtype=(tl.bfloat16, tl.bfloat16),
        is_pure=True,
        pack=4,
    )


@triton.jit
def _decode_mma_bits(packed, mult):
    """_decode_mma_asm with integer ops and exact fp32 multiplies (any backend, the interpreter)."""
    p = packed.to(tl.int32)
    m = mult.to(tl.float32)  # 2^(b - 1); lo, hi below are e2m1 * 2^-126
    lo = (((p & 0x8) << 28) | ((p & 0x7) << 22)).to(tl.float32, bitcast=True)
    hi = (((p & 0x80) << 24) | ((p & 0x70) << 18)).to(tl.float32, bitcast=True)
    return (lo * m).to(tl.bfloat16), (hi * m).to(tl.bfloat16)


@triton.jit
def _mxfp4_moe_mma_kernel(
    x_ptr, w_ptr, s_ptr, experts_ptr, y_ptr,
    N, K, stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_y, limit, n_rows,
    TOP_K: tl.constexpr, X_PER_TOKEN: tl.constexpr, DECODE_ASM: tl.constexpr, SWIGLU: tl.constexpr,
    BLOCK_OUT: tl.constexpr, BLOCK_K: tl.constexpr, SKIP_PAST_ROWS: tl.constexpr = False, PDL: tl.constexpr = False,
):
    """All strides in elements (bytes for the uint8 tensors). K % BLOCK_K == 0 (the wrapper checks).
    SKIP_PAST_ROWS: a pick whose expert id is >= n_rows (the weight's leading dim) computes and
    stores nothing (mxfp4_moe_decode_triton.py's rule)."""
    if PDL:
        gdc_wait()
    pick = tl.program_id(0)
    e = tl.load(experts_ptr + pick).to(tl.int64)
    if SKIP_PAST_ROWS:
        if e >= n_rows:  # no weight row to read: its row of y keeps what it holds
            return
    row = (pick // TOP_K if X_PER_TOKEN else pick).to(tl.int64)
    ROWS: tl.constexpr = 2 * BLOCK_OUT if SWIGLU else BLOCK_OUT
    NB: tl.constexpr = BLOCK_K // 32
    r = tl.arange(0, ROWS)
    n0 = tl.program_id(1) * BLOCK_OUT
    if SWIGLU:  # rows 0..BLOCK_OUT-1 gate n0 + r, the rest up N + n0 + r - BLOCK_OUT
        out_n = n0 + r % BLOCK_OUT
        w_n = out_n + (r // BLOCK_OUT) * N
    else:
        out_n = n0 + r
        w_n = out_n
    mask_r = out_n < N
    w_rows = w_ptr + e * stride_we + w_n.to(tl.int64)[:, None] * stride_wn
    s_rows = s_ptr + e * stride_se + w_n.to(tl.int64)[:, None] * stride_sn
    j = tl.arange(0, BLOCK_K // 2)
    col = tl.arange(0, 16)[None, :]
    col_t = tl.arange(0, 16)[:, None]
    x_row = x_ptr + row * stride_x
    acc = tl.zeros((ROWS, 16), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        packed = tl.load(w_rows + (k0 // 2 + j)[None, :], mask=mask_r[:, None], other=0)
        sb = tl.load(s_rows + (k0 // 32 + tl.arange(0, NB))[None, :], mask=mask_r[:, None], other=0).to(tl.int32)
        mult = tl.broadcast_to(scale_pair_bf16(sb)[:, :, None], (ROWS, NB, 16))
        packed = tl.reshape(packed, (ROWS, NB, 16))
        if DECODE_ASM:
            wa, wb = _decode_mma_asm(packed, mult)
        else:
            wa, wb = _decode_mma_bits(packed, mult)
        wa = tl.reshape(wa, (ROWS, BLOCK_K // 2))
        wb = tl.reshape(wb, (ROWS, BLOCK_K // 2))
        # X^T [16, BLOCK_K / 2]: row 0 = the even (odd) elements of x's step, the other rows zero;
        # transposed into the MMA's shared-memory operand
        xa, xb = tl.split(tl.reshape(tl.load(x_row + k0 + tl.arange(0, BLOCK_K)), (BLOCK_K // 2, 2)))
        xa = tl.where(col_t == 0, xa[None, :], 0.0)
        xb = tl.where(col_t == 0, xb[None, :], 0.0)
        acc = tl.dot(wa, tl.trans(xa), acc)
        acc = tl.dot(wb, tl.trans(xb), acc)
    v = tl.sum(tl.where(col == 0, acc, 0.0), axis=1)  # column 0: the pick
    dtype = y_ptr.dtype.element_ty
    offs = n0 + tl.arange(0, BLOCK_OUT)
    if SWIGLU:
        gate, up = tl.split(tl.trans(tl.reshape(v, (2, BLOCK_OUT))))
        h = clamped_swiglu_f32(gate.to(dtype).to(tl.float32), up.to(dtype).to(tl.float32), limit, dtype)
    else:
        h = v.to(dtype)
    tl.store(y_ptr + pick.to(tl.int64) * stride_y + offs, h, mask=offs < N)


# Tiles: 64 weight rows a program (wgmma's M; gate_up: 32 gate + 32 up rows, production's 32
# outputs), BLOCK_K 256 (8 scale blocks, two dots of K 128 a step), 4 warps (one warpgroup).
MMA_CONFIG = dict(BLOCK_OUT=64, BLOCK_K=256, num_warps=4, num_stages=1)
MMA_SWIGLU_CONFIG = dict(BLOCK_OUT=32, BLOCK_K=256, num_warps=4, num_stages=1)


def mma_config(swiglu: bool) -> dict:
    return MMA_SWIGLU_CONFIG if swiglu else MMA_CONFIG


def mma_scales_exact(scale: torch.Tensor) -> bool:
    """The decoder's folded scale multiply is exact for every block: every ue8m0 byte <= 128
    (run once where the weights are loaded; a device reduction and one host read)."""
    return bool(scale.numel() == 0 or int(scale.max()) <= 128)


def mxfp4_moe_mma_triton(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, experts: torch.Tensor,
                         top_k: int, per_token: bool, config: dict | None = None,
                         swiglu_limit: float | None = None, decode: str | None = None, y: torch.Tensor | None = None,
                         skip_past_rows: bool = False) -> torch.Tensor:
    """`mxfp4_moe_pick_triton`'s contract (no combine; `y` and `skip_past_rows` as there) on tensor
    cores: y [P, N] in pick order, x bf16. `config` BLOCK_OUT, BLOCK_K, num_warps, num_stages
    (default `mma_config`); `decode` "asm" (compiled CUDA) or "bits"."""
    e, n_w, half_k = weight.shape
    k = 2 * half_k
    swiglu = swiglu_limit is not None
    cfg = config or mma_config(swiglu)
    if x.dtype != torch.bfloat16 or x.stride(1) != 1:
        raise ValueError(f"x must be bf16 with unit stride along K, got {x.dtype} strides {x.stride()}")
    if k % cfg["BLOCK_K"] or weight.stride(2) != 1 or scale.stride(2) != 1:
        raise ValueError(f"K ({k}) must be a multiple of BLOCK_K ({cfg['BLOCK_K']}), weight and scale unit stride along K")
    if experts.dim() != 1 or not experts.is_contiguous():
        raise ValueError(f"experts must be contiguous [P], got {tuple(experts.shape)}")
    n = n_w // 2 if swiglu else n_w
    decode = decode or ("asm" if compiled_on_cuda(x.device) else "bits")
    if decode not in ("asm", "bits"):
        raise ValueError(f"decode must be 'asm' or 'bits', got {decode!r}")
    picks = experts.shape[0]
    y = pick_rows(y, picks, n, x)
    if picks == 0:
        return y
    _mxfp4_moe_mma_kernel[(picks, triton.cdiv(n, cfg["BLOCK_OUT"]))](
        x, weight, scale, experts, y, n, k, x.stride(0), weight.stride(0), weight.stride(1), scale.stride(0),
        scale.stride(1), y.stride(0), float(swiglu_limit) if swiglu else 0.0, e,
        TOP_K=top_k, X_PER_TOKEN=per_token, DECODE_ASM=decode == "asm", SWIGLU=swiglu,
        BLOCK_OUT=cfg["BLOCK_OUT"], BLOCK_K=cfg["BLOCK_K"], SKIP_PAST_ROWS=skip_past_rows,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **pdl_launch(x),
    )
    return y
