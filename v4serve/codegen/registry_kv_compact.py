"""Codegen registry entries of the row compaction that prefill over packed rows runs first
(v4serve/ops/kv_compact_triton.py), in their own file so merges with other registry edits stay
trivial; registry.py appends KV_COMPACT_KERNELS to KERNELS.

Shapes: DeepSeek-V4 rows fp8_e8m0_b64_rope64 at D 512 (592-byte rows) unpacked to bf16, and
DeepSeek-V4.1's two pools (fp8_e8m0_b32 window rows of 528 B, fp4_e4m3_b16 compressed rows of 288 B). The column
table is read as int32 words over a flattened [T, C] table (C is any width, so its row stride is
not marked 16-divisible); flags and slots are int32 tables; the unpack keeps `load_packed`'s 16-byte code and tail gathers. No spills. Register bounds not
set yet (no measurement): 255.
"""
from v4serve.formats import row_format
from v4serve.ops.kv_compact_triton import BLOCK_E, BLOCK_R, COMPACT_CONFIG, pool_constexprs

from .spec import Expect, KernelSpec

_OPS = "v4serve.ops.kv_compact_triton"
# window (W_) and compressed (C_) row formats: V4 one format for both; V4.1 fp8_e8m0_b32 + fp4_e4m3_b16
_V4_ROWS = {**pool_constexprs("W_", row_format("fp8_e8m0_b64_rope64"), 512),
            **pool_constexprs("C_", row_format("fp8_e8m0_b64_rope64"), 512)}
_V41_ROWS = {**pool_constexprs("W_", row_format("fp8_e8m0_b32"), 512),
             **pool_constexprs("C_", row_format("fp4_e4m3_b16"), 512)}
_UNPACK_TYPES = dict(win_ptr="*u8", cmp_ptr="*u8", ends_ptr="*i32", rows_ptr="*bf16", out_cols_ptr="*i32",
                     n_cmp_rows="i32", max_rows="i32", D="i32", stride_win="i32", stride_cmp="i32", stride_rows="i32",
                     win_programs="i32", cmp_programs="i32")
_UNPACK_ALIGNED = ("win_ptr", "cmp_ptr", "ends_ptr", "rows_ptr", "cols_ptr", "counts_ptr", "out_cols_ptr", "D",
                   "stride_win", "stride_cmp", "stride_rows")
_COLUMN_TYPES = dict(cols_ptr="*i32", counts_ptr="*i32", T="i32", C="i32", n_window="i32", n_win_rows="i32",
                     stride_ct="i32")

KV_COMPACT_KERNELS: tuple[KernelSpec, ...] = (
    KernelSpec(
        "kv_compact.flag", f"{_OPS}:_flag_used_rows_kernel",
        types=dict(_COLUMN_TYPES, used_ptr="*i32"),
        aligned=("cols_ptr", "counts_ptr", "used_ptr"),
        constexprs=dict(HAS_COUNTS=True, BLOCK_E=BLOCK_E, SKIP_SEEN=COMPACT_CONFIG["SKIP_SEEN"]), num_warps=4, num_stages=1,
        expect=Expect(kv_load_bytes=4),
    ),
    *(
        KernelSpec(
            f"kv_compact.unpack_renumber_{rows}", f"{_OPS}:_unpack_and_renumber_kernel",
            types=dict(_COLUMN_TYPES, **_UNPACK_TYPES), aligned=_UNPACK_ALIGNED,
            constexprs=dict(HAS_COUNTS=True, BLOCK_R=BLOCK_R, BLOCK_D=512, BLOCK_E=BLOCK_E, **formats),
            num_warps=4, num_stages=1,
            expect=Expect(kv_load_bytes=16, kv_lines=r"codes = tl\.load|tail = tl\.load|code_words = tl\.load"),
        )
        for rows, formats in (("fp8", _V4_ROWS), ("v41", _V41_ROWS))
    ),
)
