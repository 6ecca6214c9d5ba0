"""Triton kernel of the normalised Walsh-Hadamard transform (math: hadamard_reference.py).

`hadamard_fp32(y, D, LOG2_D)` transforms one fp32 row held in registers ([D], D = 2^LOG2_D): stage
h views the row as [D / 2h, 2, h], swaps the last two axes so that each pair (y[i], y[i + h]) is
the trailing axis, splits it, joins (a + b, a - b) and swaps back: the reference's butterflies in
its order, so the result is bit-identical. Other kernels call it on rows they already hold (the
index query's RoPE in norm_rope_triton.py, the index key in compress_decode_triton.py); the
kernel here is the standalone op (prefill's index keys).

Layouts: x and out [N, D] (unit stride along D, row stride `stride_x` / D), D a power of two.
Grid (cdiv(N, BLOCK_ROWS),): a program transforms BLOCK_ROWS rows, one at a time (a row is at
most a few KB: 128 channels for the indexer).
"""

import torch
import triton
import triton.language as tl

BLOCK_ROWS = 4


@triton.jit
def hadamard_fp32(y, D: tl.constexpr, LOG2_D: tl.constexpr):
    """H_D y / sqrt(D) of an fp32 row y [D] in registers, butterfly stage by stage."""
    for i in tl.static_range(LOG2_D):  # stage h = 2^i
        a, b = tl.split(tl.permute(tl.reshape(y, (D >> (i + 1), 2, 1 << i)), (0, 2, 1)))
        y = tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), (D,))
    return y * (D**-0.5)


@triton.jit
def _hadamard_kernel(x_ptr, out_ptr, n_rows, stride_x, D: tl.constexpr, LOG2_D: tl.constexpr,
                     BLOCK_ROWS: tl.constexpr):
    cols = tl.arange(0, D)
    for i in tl.static_range(BLOCK_ROWS):
        row = tl.program_id(0).to(tl.int64) * BLOCK_ROWS + i
        if row < n_rows:
            y = tl.load(x_ptr + row * stride_x + cols).to(tl.float32)
            tl.store(out_ptr + row * D + cols, hadamard_fp32(y, D, LOG2_D).to(out_ptr.dtype.element_ty))


def hadamard_triton(x: torch.Tensor) -> torch.Tensor:
    D = x.shape[-1]
    rows = x.reshape(-1, D)
    if rows.stride(-1) != 1:
        rows = rows.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if rows.shape[0] == 0:
        return out
    _hadamard_kernel[(triton.cdiv(rows.shape[0], BLOCK_ROWS),)](
        rows, out, rows.shape[0], rows.stride(0), D=D, LOG2_D=D.bit_length() - 1, BLOCK_ROWS=BLOCK_ROWS,
        num_warps=1 if D <= 128 else 4,
    )
    return out
