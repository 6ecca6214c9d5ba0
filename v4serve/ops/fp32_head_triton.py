"""Triton kernel of the fp32 output head over bf16 weights (math: fp32_head_reference.py).

    y[m, n] = sum_k x[m, k] * float(w[n, k])     x fp32 [M, K], w bf16 [N, K] (rows contiguous), y fp32 [M, N]

Grid (cdiv(M, BLOCK_M), cdiv(N, BLOCK_N)): a program owns BLOCK_M rows of x and BLOCK_N weight rows,
and walks K in BLOCK_K steps; the row blocks of one weight tile are neighbouring programs, so the
tile comes from HBM once and from L2 for the others. Each weight tile [BLOCK_N, BLOCK_K] is loaded as bf16 (16-byte
vectors: 8 channels a thread along K) and widened to fp32 in registers (exact: bf16 is the top half
of an fp32). Two schedules, chosen from M on the host (no device read; CUDA-graph safe):

* decode, M <= 8 (`DOT=False`): every row of x multiplies the widened tile on the FMA pipe and sums
  along K within the step ([BLOCK_M, BLOCK_N, BLOCK_K] products, an fp32 tree sum), added to an
  fp32 accumulator: no 16-row padding of a tensor-core dot for one real row. At M = 1 the program
  reads BLOCK_N x K x 2 bytes of weight and K x 4 of x: HBM-bound (the weight is the bytes).
* M > 8 (`DOT=True`): `tl.dot` with `DOT_PRECISION` "ieee" (production: a true fp32 product, no
  TF32, which Triton lowers to FMAs) or "tf32x3" (a variant on the tensor cores: x split into a TF32
  head and a TF32 tail, each times the weight; a bf16 weight has no tail, so the two products are
  exact and only the tail's rounding to TF32, ~2^-22 of |x|, is lost: within an fp32 GEMM's own
  accumulation error at K = 4096), tiles of 32 rows.

fp32 everywhere; only the summation order differs from the reference (products exact up to fp32
rounding, as in any fp32 GEMM).
"""

import torch
import triton
import triton.language as tl

DECODE_MAX_ROWS = 8  # M up to this runs the FMA schedule
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages) per schedule; decode keeps BLOCK_M x BLOCK_N x
# BLOCK_K <= 8192 products a step (64 fp32 registers a thread at 4 warps).
DECODE_CONFIGS = {1: (1, 64, 128, 4, 3), 2: (2, 64, 64, 4, 3), 4: (4, 64, 32, 4, 3), 8: (8, 32, 32, 4, 3)}
DOT_CONFIG = (32, 64, 32, 4, 3)


@triton.jit
def _fp32_head_kernel(x_ptr, w_ptr, y_ptr, M, N, K, stride_x, stride_w, stride_y,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT: tl.constexpr,
                      DOT_PRECISION: tl.constexpr = "ieee"):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok, m_ok = rn < N, rm < M
    w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_w
    x_rows = x_ptr + rm.to(tl.int64)[:, None] * stride_x
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        k_ok = rk < K
        w = tl.load(w_rows + rk[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
        x = tl.load(x_rows + rk[None, :], mask=m_ok[:, None] & k_ok[None, :], other=0.0)
        if DOT:
            acc = tl.dot(x, tl.trans(w), acc, input_precision=DOT_PRECISION)
        else:
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    tl.store(y_ptr + rm.to(tl.int64)[:, None] * stride_y + rn[None, :], acc, mask=m_ok[:, None] & n_ok[None, :])


def head_config(m: int) -> tuple[int, int, int, int, int, bool]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages, DOT) for M rows."""
    if m <= DECODE_MAX_ROWS:
        return (*DECODE_CONFIGS[triton.next_power_of_2(m)], False)
    return (*DOT_CONFIG, True)


def fp32_head_triton(x: torch.Tensor, weight: torch.Tensor, config: tuple | None = None,
                     dot_precision: str = "ieee") -> torch.Tensor:
    """`config`: head_config's tuple (None: head_config(M)); `dot_precision`: the M > 8 dot's
    ("ieee" production, "tf32x3" a variant: see the module docstring)."""
    x = x.contiguous()
    if weight.stride(1) != 1:
        raise ValueError("the head weight's rows must be contiguous")
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=torch.float32, device=x.device)
    if m == 0:
        return y
    block_m, block_n, block_k, warps, stages, dot = config or head_config(m)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _fp32_head_kernel[grid](x, weight, y, m, n, k, x.stride(0), weight.stride(0), y.stride(0),
                            BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT=dot, DOT_PRECISION=dot_precision,
                            num_warps=warps, num_stages=stages)
    return y
