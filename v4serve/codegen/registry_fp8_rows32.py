"""Codegen registry entries of the FP8 linear at 17..32 rows in weight-only numerics (W8A16: the
verify step at c8 k = 3, plain decode at c17..c32; ops/fp8_linear_triton.py, W8A16_DECODE_ALWAYS_M),
in their own file so merges with other registry edits stay trivial; registry.py appends
FP8_ROWS32_KERNELS.

The decode tile kernel `_fp8_linear_decode_kernel` with BLOCK_M 32 (every row in one tile, so each
weight byte crosses HBM once): production's FP8_DECODE_CONFIG (64 weight rows, 128-channel steps,
4 warps, 4 stages) at Flash wq_b [32768, 1024] (one split: y written directly) and at wq_a
[1024, 4096] (16 splits, summed by the last program: the SUM_LAST rule variant), and the sweep's
128-row tile (half the x re-reads from L2) at 4 and 8 warps, and the 256-row one (a quarter) at 8
warps and 3 stages. (The weights-first kernel at BLOCK_M 32,
1 step, spilled: 255 registers + 32 B of local memory at 4 warps, Triton 3.6 sm_90; not a candidate.)
bf16 x and y, e4m3 weight rows as 16-byte loads; sm_90 / 100 / 120 (sm_80 compiles the
same tile kernel with NATIVE_FP8 False: registry.py's sm80 rows cover that path's decode).
Registers (sm_90 / 100 / 120), Triton 3.6: 108-110 / 110-112 / 182 / 128 / 182-186; Triton 3.8: 110 /
148-150 / 182 / 128-140 / 182-186; shared memory 48 / 48 / 72.5 / 72 / 81 KB, no spills (3.9 not
compiled here); the bounds ~1.1 x the highest.
"""
from v4serve.ops.fp8_linear_triton import FP8_DECODE_CONFIG

from .spec import Expect, KernelSpec

_OPS = "v4serve.ops"
_TILE_TYPES = dict(x_ptr="*bf16", xs_ptr="*fp32", w_ptr="*fp8e4nv", ws_ptr="*fp32", part_ptr="*fp32", y_ptr="*bf16",
                   arrivals_ptr="*i32", M="i32", N="i32", K="i32", k_per_split="i32", stride_x="i32",
                   stride_xs="i32", stride_w="i32", stride_ws="i32", stride_y="i32", limit="fp32")
_TILE_ALIGNED = ("x_ptr", "xs_ptr", "w_ptr", "ws_ptr", "part_ptr", "y_ptr", "arrivals_ptr", "N", "K", "k_per_split",
                 "stride_x", "stride_w", "stride_y")


def _tiles(name: str, splits: int, sum_last: bool, max_regs: int, **cfg) -> KernelSpec:
    cfg = dict(FP8_DECODE_CONFIG, BLOCK_M=32, **cfg)
    return KernelSpec(
        f"fp8_linear.decode_m32_w8a16_{name}", f"{_OPS}.fp8_linear_triton:_fp8_linear_decode_kernel",
        types=_TILE_TYPES, aligned=_TILE_ALIGNED,
        constexprs=dict(PDL=True, BN=128, BK=128, AB=1, ACT_FP8=False, FP8_DOT=False, NATIVE_FP8=True,
                        POST_SCALE=True, IEEE=False, SPLITS=splits, SUM_LAST=sum_last, SWIGLU=False,
                        **{k: v for k, v in cfg.items() if k.startswith("BLOCK")}),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], archs=(90, 100, 120),
        expect=Expect(kv_load_bytes=16, kv_lines=r"(?<!_)w = tl\.load", tensor_cores=True, max_regs=max_regs),
    )


FP8_ROWS32_KERNELS: tuple[KernelSpec, ...] = (
    _tiles("one_split", 1, False, 128),                 # wq_b [32768, 1024]: 512 tiles, 8 steps each
    _tiles("sum_last", 16, True, 168),                  # wq_a [1024, 4096]: 16 tiles x 16 splits
    _tiles("n128", 1, False, 200, BLOCK_N=128),         # sweep: wq_b in 256 tiles of 128 rows
    _tiles("n128_w8", 1, False, 156, BLOCK_N=128, num_warps=8),
    _tiles("n256_w8", 1, False, 208, BLOCK_N=256, num_warps=8, num_stages=3),
)
