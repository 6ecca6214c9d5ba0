"""Codegen registry entries of the weights-first FP8 decode kernel (v4serve/ops/fp8_linear_decode_triton.py),
in their own file so merges with other registry edits stay trivial; registry.py appends FP8_DECODE_KERNELS.

Shapes: V4-Flash with the official numerics (activations e4m3 per 128, 128 x 128 weight blocks),
bf16 x (read as int32 words) and y, FP8_AHEAD_CONFIG's tiles (16 rows, 64 weight rows, 128-channel
steps), at the steps a program production uses: 1 (wkv), 2 (wq_a), 4 (shared w1 / w2, the
indexer's q_b), and V4.1's 32 x 32 blocks (32-channel steps) at 8 rows; activations quantized in
the kernel (QUANT_A, production) or read as act_quant's codes; split-K partials (summed by the
separate kernel, or by the last program, SUM_LAST) or y written directly (one split). With PDL, as
launched on sm_90+: the weight loads sit before griddepcontrol.wait. FP8 loads and dots need
sm_89+, so sm_90 / 100 / 120 only (sm_80 runs the tile kernels). Weight rows and activation codes
are 16-byte loads, x int32 words. Registers measured (Triton 3.6 / 3.8 / 3.9, sm_90 / 100 / 120):
40-140, no spills; the bound is ~10% above the highest. The weight-only numerics (W8A16, the models'
default: x bf16 read as is, the codes widened in registers): 1 and 2 steps with SUM_LAST (production's
W8A16 rule), 4 steps in the tile kernel's step order (IN_ORDER, a sweep variant).
"""
from v4serve.ops.fp8_linear_decode_triton import FP8_AHEAD_CONFIG

from .spec import Expect, KernelSpec

_CFG = FP8_AHEAD_CONFIG
_ALIGNED = ("x_ptr", "xs_ptr", "w_ptr", "ws_ptr", "part_ptr", "y_ptr", "arrivals_ptr", "N", "K", "stride_x",
            "stride_w", "stride_y")


def _entry(name: str, steps: int, splits: int, quant_a: bool = True, sum_last: bool = False,
           rows: int = 1, block: int = 128, max_regs: int = 152, weight_only: bool = False,
           in_order: bool = False) -> KernelSpec:
    x_type = "*bf16" if weight_only else "*i32" if quant_a else "*fp8e4nv"
    return KernelSpec(
        f"fp8_linear.decode_ahead_{name}", "v4serve.ops.fp8_linear_decode_triton:_fp8_linear_decode_ahead_kernel",
        types=dict(x_ptr=x_type, xs_ptr="*bf16" if quant_a or weight_only else "*fp32",
                   w_ptr="*fp8e4nv", ws_ptr="*fp32", part_ptr="*fp32", y_ptr="*bf16", arrivals_ptr="*i32",
                   M="i32", N="i32", K="i32", stride_x="i32", stride_xs="i32", stride_w="i32", stride_ws="i32",
                   stride_y="i32", limit="fp32"),
        aligned=_ALIGNED,
        constexprs=dict(PDL=True, BN=block, BK=block, AB=1 if weight_only else block, QUANT_A=quant_a and not weight_only,
                        SUM_LAST=sum_last, STEPS=steps, SPLITS=splits, ROWS=rows, BLOCK_M=_CFG["BLOCK_M"],
                        BLOCK_N=_CFG["BLOCK_N"], BLOCK_K=min(block, _CFG["BLOCK_K"]), ACT_FP8=not weight_only,
                        IN_ORDER=in_order, SWIGLU=False),
        num_warps=_CFG["num_warps"], num_stages=_CFG["num_stages"],
        archs=(90, 100, 120),
        expect=Expect(kv_load_bytes=16, kv_lines=r"(?<!_)w = tl\.load", tensor_cores=True, max_regs=max_regs),
    )


FP8_DECODE_KERNELS: tuple[KernelSpec, ...] = (
    _entry("s1_quant_a", 1, 32),                   # wkv [512, 4096]: 8 tiles x 32 splits
    _entry("s2_quant_a", 2, 16),                   # wq_a [1024, 4096]: 16 x 16
    _entry("s4_quant_a", 4, 8),                    # shared w1 [2048, 4096]: 32 x 8 (w2: 64 x 4)
    _entry("s4_codes", 4, 8, quant_a=False),       # act_quant's codes (sweep variant)
    _entry("s2_sum_last", 2, 16, sum_last=True),   # last-arriving split sum (sweep variant)
    _entry("s4_one_split", 4, 1),                  # y written directly
    _entry("s1_b32_m8", 1, 32, rows=8, block=32),  # V4.1 (32-channel groups and steps), 8 rows: [256, 1024]
    # weight-only numerics (W8A16, the models' default): x bf16 as is, the codes widened in registers
    # (3.6 sm_90: 174 / 148 / 163 registers, no spills: the batched dot of 1 step runs on every warp)
    _entry("w8a16_s1_sum_last", 1, 32, weight_only=True, sum_last=True, max_regs=200),  # wkv (production rule)
    _entry("w8a16_s2_sum_last", 2, 16, weight_only=True, sum_last=True, max_regs=200),  # wq_a (production rule)
    _entry("w8a16_s4_in_order", 4, 8, weight_only=True, in_order=True, max_regs=200),   # shared w1, tiles' order
)
