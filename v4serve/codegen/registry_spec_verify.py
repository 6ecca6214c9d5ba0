"""Codegen registry entries of the speculative verify step's kernels: the compressor steps
(v4serve/ops/compress_verify_triton.py: the pooling over channel slices and the row finish) and the
state commit (v4serve/ops/state_commit_triton.py), in their own file so merges with other registry
edits stay trivial; registry.py appends SPEC_VERIFY_KERNELS.

Shapes: V4-Flash's CSA kv compressor (overlap, ratio 4, head_dim 512), its indexer compressor
(overlap, ratio 4, head_dim 128, Hadamard, packed fp4_e8m0_b32 keys) and HCA compressor (online,
ratio 128, head_dim 512), with the rollback's undo journal (SAVE: the sub-rows each group
overwrites, stored beside the step's own loads); the finish writes packed fp8_e8m0_b64_rope64 rows
(the GPU default cache) or the indexer's fp4 keys. Warps as the launcher picks them
(`launch_warps`: the decode kernel's thread layouts, checked in tests/test_codegen.py). The
groups loop is a runtime loop (k + 1 groups, any k). Registers under Triton 3.6 / 3.8 / 3.9, sm_90
/ sm_80 (bounds ~10% above the most), no spills: CSA pooling 163-216 at one warp (the decode
kernel's per-thread tiles: 4 channels x r rows x kv, score, both halves), indexer pooling 64-91
(4 warps), HCA pooling 58-62, finish 30-35. Registers cost nothing here: one warp a slice, at
most S x 4 CTAs. The journal's loads and the state stores over them share one layout per shape
(checked in the TTGIR: the 1-D rows one blocked layout, the [r, 128] tiles another), so each
pre-image is read by the thread that then overwrites it.
The commit reads its pointers from an int64 table (int -> pointer casts) and copies the journal's
marked fp32 sub-rows.
"""
from v4serve.formats import row_format
from v4serve.ops.kv_pack_triton import packed_constexprs
from v4serve.ops.compress_verify_triton import CHANNELS_PER_PROGRAM, launch_warps
from v4serve.ops.state_commit_triton import BLOCK as COMMIT_BLOCK, TABLE_COLUMNS

from .spec import Expect, KernelSpec

_OPS = "v4serve.ops"

_POOL_TYPES = dict(kv_ptr="*fp32", score_ptr="*fp32", pos_ptr="*i64", slot_ptr="*i64", bias_ptr="*fp32",
                   s0_ptr="*fp32", s1_ptr="*fp32", s2_ptr="*fp32", pooled_ptr="*fp32", saved_ptr="*fp32",
                   written_ptr="*i32", S="i32", groups="i32", d="i32", stride_in="i32", stride_slot="i32",
                   stride_saved="i32", stride_written="i32")
_FINISH_TYPES = dict(pooled_ptr="*fp32", pos_ptr="*i64", w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32",
                     rows_of_ptr="*i32", rows_ptr="*bf16", target_ptr="*i64", pool_ptr="*u8", d="i32", R="i32",
                     scratch="i32", eps="fp32", stride_rows_of="i32", stride_cs="i32", stride_pool="i32")

SPEC_VERIFY_KERNELS: tuple[KernelSpec, ...] = (
    *(
        KernelSpec(
            f"compress_verify.{kind}_pool", f"{_OPS}.compress_verify_triton:_compress_verify_pool_kernel",
            types=_POOL_TYPES,
            aligned=("kv_ptr", "score_ptr", "pos_ptr", "slot_ptr", "bias_ptr", "s0_ptr", "s1_ptr", "s2_ptr",
                     "pooled_ptr", "saved_ptr", "written_ptr", "d", "stride_in", "stride_slot", "stride_saved"),
            constexprs=dict(PDL=False, RATIO=ratio, OVERLAP=overlap, BLOCK_R=block_r,
                            BLOCK_C=min(d, CHANNELS_PER_PROGRAM), SAVE=True),
            num_warps=launch_warps(d)[0], num_stages=1, expect=expect,
        )
        for kind, ratio, overlap, block_r, d, expect in (
            ("csa", 4, True, 4, 512, Expect(max_regs=240)),
            ("index", 4, True, 4, 128, Expect(max_regs=100)),
            ("hca", 128, False, 1, 512, Expect(max_regs=66)),
        )
    ),
    *(
        KernelSpec(
            f"compress_verify.finish_{kind}", f"{_OPS}.compress_verify_triton:_compress_verify_finish_kernel",
            types=_FINISH_TYPES,
            # stride_pool aligned for the 592-byte fp8 rows only (68-byte fp4 rows are not 16-byte multiples)
            aligned=("pooled_ptr", "pos_ptr", "w_ptr", "cos_ptr", "sin_ptr", "rows_of_ptr", "rows_ptr", "target_ptr",
                     "pool_ptr", "d", *(("stride_pool",) if kind == "fp8kv" else ())),
            constexprs=dict(PDL=False, RATIO=4, BLOCK_D=d, PACKED=True, **packed_constexprs(row_format(fmt), d),
                            HADAMARD=hadamard, LOG2_D=d.bit_length() - 1 if hadamard else 0),
            num_warps=launch_warps(d)[1], num_stages=3, expect=Expect(max_regs=regs),
        )
        for kind, fmt, d, hadamard, regs in (("fp8kv", "fp8_e8m0_b64_rope64", 512, False, 36),
                                             ("index_fp4", "fp4_e8m0_b32", 128, True, 40))
    ),
    KernelSpec(
        "state_commit", "v4serve.ops.state_commit_triton:_state_commit_kernel",
        types=dict(table_ptr="*i64", slots_ptr="*i64", accepted_ptr="*i64"),
        aligned=("table_ptr", "slots_ptr", "accepted_ptr"),
        constexprs=dict(BLOCK=COMMIT_BLOCK, COLUMNS=TABLE_COLUMNS, PDL=False), num_warps=4, num_stages=1, expect=Expect(max_regs=128),
    ),
)
