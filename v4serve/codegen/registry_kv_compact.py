"""Codegen registry entries of the row compaction that prefill over packed rows runs first
(v4serve/ops/kv_compact_triton.py), in their own file so merges with other registry edits stay
trivial; registry.py appends KV_COMPACT_KERNELS to KERNELS.

Shapes: DeepSeek-V4 rows fp8_e8m0_b64_rope64 at D 512 (592-byte rows) unpacked to bf16. The column
table is read as int32 words over a flattened [T, C] table (C is any width, so its row stride is
not marked 16-divisible); flags and slots are int32 tables; the unpack keeps `load_packed`'s 16-byte code and tail gathers. No spills. Register bounds not
set yet (no measurement): 255.
"""
from v4serve.formats import row_format
from v4serve.ops.kv_compact_triton import BLOCK_E, BLOCK_R, COMPACT_CONFIG
from v4serve.ops.kv_pack_triton import packed_constexprs

from .spec import Expect, KernelSpec

_OPS = "v4serve.ops.kv_compact_triton"
_FP8 = packed_constexprs(row_format("fp8_e8m0_b64_rope64"), 512)
_LOAD_PK = {k: _FP8[k] for k in ("PK_NQ", "PK_BLOCK", "PK_TAIL_OFF", "PK_SCALE_OFF", "PK_HAS_TAIL")}
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
    KernelSpec(
        "kv_compact.unpack_renumber_fp8", f"{_OPS}:_unpack_and_renumber_kernel",
        types=dict(_COLUMN_TYPES, win_ptr="*u8", cmp_ptr="*u8", ends_ptr="*i32", rows_ptr="*bf16",
                   out_cols_ptr="*i32", n_pool_rows="i32", max_rows="i32", D="i32", stride_pool="i32",
                   stride_rows="i32", unpack_programs="i32"),
        aligned=("win_ptr", "cmp_ptr", "ends_ptr", "rows_ptr", "cols_ptr", "counts_ptr", "out_cols_ptr", "D",
                 "stride_pool", "stride_rows"),
        constexprs=dict(HAS_COUNTS=True, BLOCK_R=BLOCK_R, BLOCK_D=512, BLOCK_E=BLOCK_E, **_LOAD_PK),
        num_warps=4, num_stages=1,
        expect=Expect(kv_load_bytes=16, kv_lines=r"codes = tl\.load|tail = tl\.load"),
    ),
)
