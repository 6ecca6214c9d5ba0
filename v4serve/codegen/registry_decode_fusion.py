"""Codegen registry entries of the decode step's fusions (session 12), kept in their own file so that
merges with other registry edits stay trivial; registry.py appends DECODE_FUSION_KERNELS to KERNELS
(the mixer's coefficients epilogue sits beside the mixer's entries there).

- `hadamard.keys`: the standalone Walsh-Hadamard kernel (ops/hadamard_triton.py), 128-channel bf16
  rows, 4 rows a program, one warp: each butterfly stage is register shuffles, no loads.
- `norm_rope.index_q_hadamard`: the index query's RoPE (64 heads x 128, rope 64) with the
  transform after its rounding (HADAMARD).
- `compress_decode.index_fp4_hadamard`: the indexer's key compressor (overlap, ratio 4, d 128) with
  the transform, packed into fp4_e8m0_b32 index rows.
- `mhc.collapse_norm`: the mHC collapse with the sublayer's RMSNorm, one program per token over the
  whole 4096-channel row (8 warps, as the norm's own kernel).
Register bounds: the kernels they extend had 128 / 168; the transform holds one more [D] row.
"""
from v4serve.formats import row_format
from v4serve.ops.hadamard_triton import BLOCK_ROWS as HADAMARD_ROWS
from v4serve.ops.kv_pack_triton import packed_constexprs

from .registry_packed_kv import COMPRESS_DECODE_ALIGNED, compress_decode_types
from .spec import Expect, KernelSpec

_OPS = "v4serve.ops"
_FP4 = packed_constexprs(row_format("fp4_e8m0_b32"), 128)
_NO_PK = dict(PACKED=False, PK_FP4=False, PK_NQ=0, PK_BLOCK=1, PK_TAIL_OFF=0, PK_SCALE_OFF=0, PK_HAS_TAIL=False,
              PK_PAYLOAD=0, PK_ROW_BYTES=0)

DECODE_FUSION_KERNELS = (
    KernelSpec(
        "hadamard.keys", f"{_OPS}.hadamard_triton:_hadamard_kernel",
        types=dict(x_ptr="*bf16", out_ptr="*bf16", n_rows="i32", stride_x="i32"),
        aligned=("x_ptr", "out_ptr", "stride_x"),
        constexprs=dict(D=128, LOG2_D=7, BLOCK_ROWS=HADAMARD_ROWS), num_warps=1, num_stages=3,
        expect=Expect(max_regs=128),
    ),
    KernelSpec(  # rope only (no norm), D 128, rope 64, then the transform; norm_rope_warps(128) = 1
        "norm_rope.index_q_hadamard", f"{_OPS}.norm_rope_triton:_rms_norm_rope_kernel",
        types=dict(x_ptr="*bf16", w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", out_ptr="*bf16",
                   pool_ptr="*bf16", pool_rows_ptr="*bf16", D="i32", R="i32", heads="i32", eps="fp32",
                   stride_x="i32", stride_o="i32", stride_cs="i32", stride_pool="i32"),
        aligned=("x_ptr", "w_ptr", "cos_ptr", "sin_ptr", "out_ptr", "pool_ptr", "pool_rows_ptr", "D", "stride_x",
                 "stride_o", "stride_pool"),
        constexprs=dict(PDL=False, NORM=False, HAS_WEIGHT=False, ROPE=True, INVERSE=False, BLOCK_D=128,
                        HADAMARD=True, LOG2_D=7, **_NO_PK),
        num_warps=1, num_stages=3, expect=Expect(max_regs=128),
    ),
    KernelSpec(
        "compress_decode.index_fp4_hadamard", f"{_OPS}.compress_decode_triton:_compress_decode_kernel",
        types=compress_decode_types(pool_ptr="*u8"), aligned=COMPRESS_DECODE_ALIGNED,
        constexprs=dict(PDL=False, RATIO=4, OVERLAP=True, BLOCK_R=4, BLOCK_D=128, HADAMARD=True, LOG2_D=7,
                        PACKED=True, **_FP4),
        num_warps=4, num_stages=3, expect=Expect(max_regs=168),
    ),
    KernelSpec(
        "mhc.collapse_norm", f"{_OPS}.hc_collapse_triton:_hc_collapse_norm_kernel",
        types=dict(x_ptr="*bf16", pre_ptr="*fp32", w_ptr="*bf16", y_ptr="*bf16", D="i32", stride_xt="i32",
                   stride_xn="i32", eps="fp32"),
        aligned=("x_ptr", "pre_ptr", "w_ptr", "y_ptr", "D", "stride_xt", "stride_xn"),
        constexprs=dict(PDL=False, N=4, BLOCK_D=4096), num_warps=8, num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"x = tl\.load", max_regs=128),
    ),
)
