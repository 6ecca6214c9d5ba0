"""Codegen registry entries of the kernels DeepSeek-V4.1's engine path adds (its decode and prefill
attention over two packed row formats, its Engram lookup), in their own file so merges with other
registry edits stay trivial; registry.py appends V41_ENGINE_KERNELS to KERNELS.

Shapes: V4.1-Flash: window rows fp8_e8m0_b32 (528 B) and compressed rows fp4_e4m3_b16 (288 B) at
D 512, unpacked to bf16 (and the compressed rows packed); Engram tables of 256 e4m3 codes per row
with 8 ue8m0 bytes. Expectations:
the code gathers stay 16-byte loads (fp4 rows: 256 code bytes, then 32 scale bytes at a 16-byte
offset), no load narrower than 4 bytes, no spills. Register bounds not set (no measurement): 255.
"""
from v4serve.formats import row_format
from v4serve.ops.kv_pack_fp4_e4m3_triton import UNPACK_ROWS
from v4serve.ops.engram_lookup_triton import LOOKUP_CONFIG

from .registry_packed_kv import unpack_columns_spec
from .spec import Expect, KernelSpec

_OPS = "v4serve.ops"
_FP4 = row_format("fp4_e4m3_b16")

V41_ENGINE_KERNELS: tuple[KernelSpec, ...] = (
    unpack_columns_spec("sparse_attn.unpack_columns_v41kv", "fp8_e8m0_b32", "fp4_e4m3_b16"),
    KernelSpec(
        "kv_pack.unpack_rows_fp4_e4m3", f"{_OPS}.kv_pack_fp4_e4m3_triton:_unpack_fp4_e4m3_rows_kernel",
        types=dict(packed_ptr="*u8", out_ptr="*bf16", N="i32", D="i32", stride_p="i32", stride_o="i32"),
        aligned=("packed_ptr", "out_ptr", "D", "stride_p", "stride_o"),
        constexprs=dict(BLOCK_R=UNPACK_ROWS, BLOCK_D=512, FP4_NQ=512, FP4_BLOCK=_FP4.block,
                        FP4_SCALE_OFF=_FP4.scales_offset(512)),
        num_warps=4, num_stages=1,
        expect=Expect(kv_load_bytes=16, kv_lines=r"code_words = tl\.load"),
    ),
    KernelSpec(  # the compressed rows' store (kv sources; one row per program)
        "kv_pack.store_rows_fp4_e4m3", f"{_OPS}.kv_pack_fp4_e4m3_triton:_store_fp4_e4m3_rows_kernel",
        types=dict(x_ptr="*bf16", rows_ptr="*i64", pool_ptr="*u8", D="i32", stride_x="i32", stride_pool="i32"),
        aligned=("x_ptr", "rows_ptr", "pool_ptr", "D", "stride_x", "stride_pool"),
        constexprs=dict(HAS_ROWS=True, BLOCK_D=512, FP4_NQ=512, FP4_BLOCK=_FP4.block,
                        FP4_SCALE_OFF=_FP4.scales_offset(512), FP4_ROW_BYTES=_FP4.row_bytes(512)),
        num_warps=2, num_stages=1,
        expect=Expect(kv_load_bytes=16, kv_lines=r"y = tl\.load"),
    ),
    KernelSpec(  # LOOKUP_CONFIG
        "engram.lookup", f"{_OPS}.engram_lookup_triton:_engram_lookup_kernel",
        types=dict(codes_ptr="*u8", scales_ptr="*u8", rows_ptr="*i64", out_ptr="*bf16", n_rows="i32",
                   head_dim="i32", stride_codes="i32", stride_scales="i32", stride_out="i32"),
        aligned=("codes_ptr", "scales_ptr", "rows_ptr", "out_ptr", "head_dim", "stride_codes", "stride_out"),
        constexprs=dict(BLOCK_ROWS=LOOKUP_CONFIG["BLOCK_ROWS"], BLOCK_D=256, SCALE_BLOCK=32),
        num_warps=LOOKUP_CONFIG["num_warps"], num_stages=1,
        expect=Expect(kv_load_bytes=16, kv_lines=r"codes = tl\.load"),
    ),
)
