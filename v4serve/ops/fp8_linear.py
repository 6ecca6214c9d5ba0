"""FP8 block-scaled linear: public entry points (math in fp8_linear_reference.py, kernels in
fp8_linear_triton.py).

    fp8_linear(x, weight, scale, block=(128, 128), act_block=None, impl="auto") -> y [..., N]

x [..., K] (bf16 / fp16 / fp32, unit stride along K); weight float8_e4m3fn [N, K]; scale float32
[ceil(N / bn), ceil(K / bk)] (ue8m0 checkpoints: powers of two; V4-Flash-Base: any fp32).
act_block None: weight-only numerics y = x @ (w * s)^T (fp32 accumulation, rounded to x.dtype once);
act_block 128 (V4) / 32 (V4.1): the official numerics, x quantized to e4m3 per act_block channels
with ue8m0 scales first (`act_quant`).
The Triton path runs the tile kernels of fp8_linear_triton.py (tensor cores; decode tiles at small
M), and at decode, where a program's K range fits in registers, the weights-first kernel of
fp8_linear_decode_triton.py (weights requested before the wait on the previous kernel, the
activations quantized in the same launch; in weight-only numerics too, where W8A16_DECODE_RULE of
fp8_linear_triton.py takes it). `fp8_linear_swiglu` runs a stacked gate | up weight (the shared expert's w1 and w3) and their
clamped SwiGLU, on the decode kernels in one launch with the bits of the three it replaces.
A GEMV without tensor cores for M <= 8 was built and measured in session 12 and lost or
tied at every projection (docs/performance.md "Session 12"), so it was removed.

Not used: torch._scaled_mm / torch.nn.functional.scaled_mm. PyTorch's blockwise recipe (1x128
activation scales x 128x128 weight scales, cuBLASLt) covers only the V4 / V4-Pro act_block=128 path,
only on sm_90 and only in torch builds against CUDA >= 12.9 (M padded to a multiple of 4); it does
not cover V4.1's 32x32 blocks, the weight-only numerics or sm_80/100/120. A candidate
for large-M prefill on the H200 once measured against the Triton prefill kernel.
"""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.fp8_linear_reference import act_quant_reference, fp8_linear_reference
from v4serve.ops.fp8_linear_triton import act_quant_triton, fp8_linear_triton
from v4serve.ops.swiglu_reference import clamped_swiglu_reference
from v4serve.ops.weight_formats import check_fp8_weight


def _check(x, weight, scale, block, act_block):
    check_fp8_weight(weight, scale, tuple(block))
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x [..., K] must match weight [N, K] = {list(weight.shape)}, got x {list(x.shape)}")
    if x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ValueError(f"x must be bf16, fp16 or fp32, got {x.dtype}")
    if act_block is not None and (not isinstance(act_block, int) or act_block < 1):
        raise ValueError(f"act_block must be None or a positive int, got {act_block!r}")


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block=(128, 128),
               act_block: int | None = None, impl: str = "auto", arrivals: torch.Tensor | None = None) -> torch.Tensor:
    """y [..., N] = A @ (weight * scale)^T, A = x or its e4m3 / ue8m0 quantization per act_block.
    `arrivals`: int32 zeros [>= ceil(N / 64)] that the caller keeps across calls (every launch
    leaves them at zero): the decode kernels then sum their split-K partials in the last program
    of each tile instead of a second launch (fp8_linear_decode_triton.py; the tile kernels in
    weight-only mode where W8A16_DECODE_RULE says SUM_LAST). FP8Linear keeps them."""
    block = tuple(block)
    _check(x, weight, scale, block, act_block)
    if use_triton(impl, x, weight, scale):
        y = fp8_linear_triton(x.reshape(-1, x.shape[-1]), weight, scale, block, act_block, arrivals=arrivals)
        return y.reshape(*x.shape[:-1], weight.shape[0])
    return fp8_linear_reference(x, weight, scale, block, act_block)


# Rows up to which the SwiGLU runs in the decode kernels' epilogue (`arrivals` given); beyond, the
# stacked linear without counters and the SwiGLU kernel. Measured on the H200 (session 16,
# `kernel_configs 'fp8 decode swiglu'`, µs, epilogue vs linear + SwiGLU kernel, same bits): Flash
# M32 12.44 vs 12.58, M64 23.41 vs 17.26; Pro M32 24.36 vs 25.09, M64 42.58 vs 35.29.
SWIGLU_EPILOGUE_MAX_ROWS = 32


def fp8_linear_swiglu(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, limit: float, block=(128, 128),
                      act_block: int | None = None, impl: str = "auto",
                      arrivals: torch.Tensor | None = None) -> torch.Tensor:
    """h [..., I] = clamped_swiglu(x W1^T, x W3^T, limit) for a stacked weight [W1; W3] [2I, K] (I a
    multiple of the block's rows, so the block scales [W1's; W3's] stack too: `fusion.fuse_fp8_rows`),
    gate and up each rounded to x.dtype first, exactly as `fp8_linear` of each half then
    `clamped_swiglu` would give it (the reference runs them so; the Triton path chooses its kernel
    and K split for an I-row weight, so each half gets its own bits). `arrivals`: the decode
    kernels' counters (int32 zeros [>= 2I / 64], kept by the caller): the last program of each
    pair of gate / up tiles then writes h, one launch instead of three (up to
    SWIGLU_EPILOGUE_MAX_ROWS rows); without them, or for more rows, the linear, then the SwiGLU
    kernel."""
    block = tuple(block)
    _check(x, weight, scale, block, act_block)
    n = weight.shape[0]
    if n % 2 or (n // 2) % block[0]:
        raise ValueError(f"a stacked gate | up weight has 2I rows, I a multiple of the block's {block[0]} rows, got "
                         f"{n}")
    if use_triton(impl, x, weight, scale):
        rows = x.reshape(-1, x.shape[-1])
        in_epilogue = rows.shape[0] <= SWIGLU_EPILOGUE_MAX_ROWS
        h = fp8_linear_triton(rows, weight, scale, block, act_block, arrivals=arrivals if in_epilogue else None,
                              swiglu_limit=limit)
        return h.reshape(*x.shape[:-1], n // 2)
    i, bi = n // 2, n // 2 // block[0]
    gate = fp8_linear_reference(x, weight[:i], scale[:bi], block, act_block)
    up = fp8_linear_reference(x, weight[i:], scale[bi:], block, act_block)
    return clamped_swiglu_reference(gate, up, limit)


def act_quant(x: torch.Tensor, block: int, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """(codes float8_e4m3fn [M, K], scales float32 [M, ceil(K / block)]) of x [M, K]: the official
    activation quantization (ue8m0 scale per `block` channels, e4m3 round-to-nearest-even)."""
    if x.dim() != 2:
        raise ValueError(f"x must be [M, K], got {list(x.shape)}")
    if use_triton(impl, x):
        return act_quant_triton(x, block)
    return act_quant_reference(x, block)
