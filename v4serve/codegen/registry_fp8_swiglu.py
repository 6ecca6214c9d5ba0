"""Codegen registry entries of the FP8 decode kernels with the shared expert's clamped SwiGLU in the
epilogue (SWIGLU: a stacked gate | up weight [2I, K]; the last program of each pair of gate / up
tiles sums both tiles' split partials and writes h [M, I]: `fp8_linear_decode_triton.store_split_swiglu`),
in their own file so merges with other registry edits stay trivial; registry.py appends
FP8_SWIGLU_KERNELS.

Weight-only numerics (W8A16, the models' default), bf16 x and h, e4m3 weight rows as 16-byte loads,
with PDL as launched on sm_90+, at the kernels and splits production picks for the members' shape
(W8A16_DECODE_RULE / _ROWS32_RULE at an I-row weight): the decode tiles at 16 rows (Flash
[2 x 2048, 4096]: 64 tiles x 8 splits; Pro [2 x 3072, 7168]: 96 x 6) and 32 rows (Flash, BLOCK_M
32) and 64 rows (BLOCK_M 64, 33..64 rows where the prefill tiles would leave SMs idle), and the
weights-first kernel at one K step (a Flash tensor-parallel rank at 8 GPUs, I = 256:
8 tiles x 32 splits, the rule's "ahead"). sm_90 / 100 / 120 (sm_80 compiles the same tile kernel
with NATIVE_FP8 False). The bounds are the plain kernels' (registry_fp8_rows32.py,
registry_fp8_decode.py) but at 64 rows: the epilogue runs after the MMA, once its registers are free.
Measured (Triton 3.6, sm_90 / 100 / 120): registers 80 / 80 / 110-112 / 186-198 / 188-210 (the plain
kernels on sm_90: 80 / 80 / 110 / 142 / 174), no spills. The weights-first entry: 2 programs a SM by
registers like the plain one on sm_90 (174); on sm_100 the plain one took 168 (3 a SM), this one 210 (2):
only a tensor-parallel rank's shared expert on Blackwell runs it (the unfused path there if it loses).
"""
from v4serve.ops.fp8_linear_decode_triton import FP8_AHEAD_CONFIG
from v4serve.ops.fp8_linear_triton import FP8_DECODE_CONFIG

from .spec import Expect, KernelSpec

_OPS = "v4serve.ops"
_COMMON_TYPES = dict(xs_ptr="*bf16", w_ptr="*fp8e4nv", ws_ptr="*fp32", part_ptr="*fp32", y_ptr="*bf16",
                     arrivals_ptr="*i32", M="i32", N="i32", K="i32", stride_x="i32", stride_xs="i32",
                     stride_w="i32", stride_ws="i32", stride_y="i32", limit="fp32")
_ALIGNED = ("x_ptr", "xs_ptr", "w_ptr", "ws_ptr", "part_ptr", "y_ptr", "arrivals_ptr", "N", "K", "stride_x",
            "stride_w", "stride_y")
_EXPECT = dict(kv_load_bytes=16, kv_lines=r"(?<!_)w = tl\.load", tensor_cores=True)


def _tiles(name: str, splits: int, rows: int, max_regs: int) -> KernelSpec:
    cfg = dict(FP8_DECODE_CONFIG, BLOCK_M=rows)
    return KernelSpec(
        f"fp8_linear.decode_swiglu_w8a16_{name}", f"{_OPS}.fp8_linear_triton:_fp8_linear_decode_kernel",
        types=dict(x_ptr="*bf16", k_per_split="i32", **_COMMON_TYPES), aligned=(*_ALIGNED, "k_per_split"),
        constexprs=dict(PDL=True, BN=128, BK=128, AB=1, ACT_FP8=False, FP8_DOT=False, NATIVE_FP8=True,
                        POST_SCALE=True, IEEE=False, SPLITS=splits, SUM_LAST=False, SWIGLU=True,
                        **{k: v for k, v in cfg.items() if k.startswith("BLOCK")}),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], archs=(90, 100, 120),
        expect=Expect(max_regs=max_regs, **_EXPECT),
    )


def _ahead(name: str, steps: int, splits: int, max_regs: int) -> KernelSpec:
    cfg = FP8_AHEAD_CONFIG
    return KernelSpec(
        f"fp8_linear.decode_ahead_swiglu_w8a16_{name}",
        f"{_OPS}.fp8_linear_decode_triton:_fp8_linear_decode_ahead_kernel",
        types=dict(x_ptr="*bf16", **_COMMON_TYPES), aligned=_ALIGNED,
        constexprs=dict(PDL=True, BN=128, BK=128, AB=1, QUANT_A=False, SUM_LAST=True, STEPS=steps, SPLITS=splits,
                        ROWS=1, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                        ACT_FP8=False, IN_ORDER=False, SWIGLU=True),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], archs=(90, 100, 120),
        expect=Expect(max_regs=max_regs, **_EXPECT),
    )


FP8_SWIGLU_KERNELS: tuple[KernelSpec, ...] = (
    _tiles("flash_m16", 8, 16, 168),   # Flash shared w1 + w3 [2 x 2048, 4096]: 64 tiles x 8 splits
    _tiles("pro_m16", 6, 16, 168),     # Pro [2 x 3072, 7168]: 96 tiles x 6 splits
    _tiles("flash_m32", 8, 32, 168),   # 17..32 rows (verify batches): BLOCK_M 32
    # 33..64 rows where the prefill tiles would underfill (BLOCK_M 64): 198 registers (the plain tile 142),
    # no spill; 104 KB of shared memory holds it at 2 programs a SM either way
    _tiles("flash_m64", 8, 64, 216),
    _ahead("tp8_s1", 1, 32, 232),      # Flash at 8-way tensor parallel [2 x 256, 4096]: 1 step, 32 splits
)
