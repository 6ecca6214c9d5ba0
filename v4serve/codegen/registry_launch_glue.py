"""Codegen registry entries of session 13's launch-glue fusions, in their own file so that merges with
other registry edits stay trivial; registry.py appends LAUNCH_GLUE_KERNELS to KERNELS.

- `norm_rope.kv_q_a_pair_fp8kv` / `_bf16kv`: the window append (kv_norm + rope 64 at D 512, packed
  into fp8_e8m0_b64_rope64 rows or not) with the q_a_norm of the 1024-channel low-rank q (Flash's
  q_lora_rank) in programs of the same launch; warps from the wider row (norm_rope_warps(1024) = 4).
- `pick_columns.decode`: a CSA decode step's 128 window columns and 512 top-k rows, one program per
  sequence over 1024 lanes, 4 warps.
Register bounds: those of the norm kernel's own entries (128); the pick kernel holds a few words a lane.
"""
from v4serve.formats import row_format
from v4serve.ops.kv_pack_triton import packed_constexprs

from .spec import Expect, KernelSpec

_OPS = "v4serve.ops"
_FP8 = packed_constexprs(row_format("fp8_e8m0_b64_rope64"), 512)
_NO_PK = dict(PACKED=False, PK_FP4=False, PK_NQ=0, PK_BLOCK=1, PK_TAIL_OFF=0, PK_SCALE_OFF=0, PK_HAS_TAIL=False,
              PK_PAYLOAD=0, PK_ROW_BYTES=0)


def _pair_spec(name: str, packed: dict) -> KernelSpec:
    pool = "*u8" if packed["PACKED"] else "*bf16"
    rows = "*i64" if packed["PACKED"] else "*bf16"  # unpacked: the launch passes x again
    return KernelSpec(
        name, f"{_OPS}.norm_rope_triton:_rms_norm_rope_pair_kernel",
        types=dict(x_ptr="*bf16", w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", out_ptr="*bf16", pool_ptr=pool,
                   pool_rows_ptr=rows, D="i32", R="i32", eps="fp32", stride_x="i32", stride_o="i32",
                   stride_cs="i32", stride_pool="i32", x2_ptr="*bf16", w2_ptr="*bf16", out2_ptr="*bf16", D2="i32",
                   stride_x2="i32", n_rows="i32"),
        aligned=("x_ptr", "w_ptr", "cos_ptr", "sin_ptr", "out_ptr", "pool_ptr", "pool_rows_ptr", "D", "stride_x",
                 "stride_o", "stride_pool", "x2_ptr", "w2_ptr", "out2_ptr", "D2", "stride_x2"),
        constexprs=dict(PDL=False, ROPE=True, BLOCK_D=512, BLOCK_D2=1024, heads=1, **packed),
        num_warps=4, num_stages=3, expect=Expect(max_regs=128),
    )


LAUNCH_GLUE_KERNELS = (
    _pair_spec("norm_rope.kv_q_a_pair_fp8kv", dict(PACKED=True, **_FP8)),
    _pair_spec("norm_rope.kv_q_a_pair_bf16kv", _NO_PK),
    KernelSpec(
        "pick_columns.decode", f"{_OPS}.pick_columns_triton:_pick_columns_kernel",
        types=dict(prefix_ptr="*i32", rows_ptr="*i32", order_ptr="*i64", out_ptr="*i32", W="i32", K="i32",
                   stride_pb="i32", stride_rb="i32", stride_ob="i32"),
        aligned=("prefix_ptr", "rows_ptr", "order_ptr", "out_ptr", "W", "K", "stride_pb", "stride_rb", "stride_ob"),
        constexprs=dict(PDL=False, BLOCK=1024), num_warps=4, num_stages=3, expect=Expect(max_regs=64),
    ),
)
