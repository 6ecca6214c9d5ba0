"""Codegen registry entries of the FP8 GEMV (v4serve/ops/fp8_gemv_triton.py), in their own file so
merges with other registry edits stay trivial; registry.py appends FP8_GEMV_KERNELS.

Shapes: V4-Flash wq_a [1024, 4096] with the official numerics (activation codes e4m3 per 128,
128 x 128 weight blocks), bf16 output, at the wrapper's tiles (GEMV_CONFIG: 64 rows a program)
for M = 1 (row 0's activation codes in the prefetch ring: X_AHEAD) and M = 8, writing y (one split) or fp32 partials (split-K: out_ptr fp32); V4.1's
32 x 32 blocks (per-row weight scales: SHARED_ROW_SCALE=False) at M = 1. The hardware e4m3x2
conversion (CVT_ASM) needs sm_89+, so those entries compile for sm_90 / 100 / 120; sm_80 gets the
integer decoder. Weight words and activation codes are 16-byte loads (`words = tl.load`); the scales
are 4-byte loads. No tensor cores (FFMA only).
"""
from v4serve.ops.fp8_gemv_triton import GEMV_CONFIG

from .spec import Expect, KernelSpec

_TYPES = dict(x_ptr="*u8", xs_ptr="*fp32", w_ptr="*u8", ws_ptr="*fp32", N="i32", K="i32", k_per_split="i32",
              stride_x="i32", stride_xs="i32", stride_w="i32", stride_ws="i32", stride_os="i32", stride_om="i32")
_ALIGNED = ("x_ptr", "xs_ptr", "w_ptr", "ws_ptr", "out_ptr", "N", "K", "k_per_split", "stride_x", "stride_w",
            "stride_os", "stride_om")


def _entry(m: int, block: int, split: bool, asm: bool, max_regs: int) -> KernelSpec:
    cfg = GEMV_CONFIG
    return KernelSpec(
        f"fp8_linear.gemv_m{m}_b{block}{'_split' if split else ''}{'' if asm else '_bits'}",
        "v4serve.ops.fp8_gemv_triton:_fp8_gemv_kernel",
        types=dict(_TYPES, out_ptr="*fp32" if split else "*bf16"),
        aligned=_ALIGNED,
        constexprs=dict(PDL=False, BN=block, BK=block, AB=block, ACT_FP8=True, CVT_ASM=asm, ROWS=m, PREFETCH=cfg["PREFETCH"], X_AHEAD=m == 1,
                        SHARED_ROW_SCALE=block % cfg["BLOCK_N"] == 0, EVEN_K=True,
                        BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"]),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        archs=(90, 100, 120) if asm else (80,),
        expect=Expect(kv_load_bytes=16, kv_lines=r"words = tl\.load", max_regs=max_regs),
    )


# Registers measured under Triton 3.6 / 3.8 / 3.9 (sm_90 / 100 / 120; sm_80 for the integer decoder):
# M1 128-blocks 96-102, M8 179-190, M1 32-blocks 123-128, integer decoder 168; bounds ~10% above.
FP8_GEMV_KERNELS: tuple[KernelSpec, ...] = (
    _entry(1, 128, split=True, asm=True, max_regs=112),   # wq_a / wkv / shared_w1 / wo_b / shared_w2 at M1
    _entry(1, 128, split=False, asm=True, max_regs=112),  # wq_b at M1 (512 tiles: no split)
    _entry(8, 128, split=True, asm=True, max_regs=210),
    _entry(1, 32, split=False, asm=True, max_regs=140),   # V4.1 32 x 32 blocks
    _entry(1, 128, split=True, asm=False, max_regs=185),  # sm_80: the integer decoder
)
