"""Codegen registry entries of the speculative verify step's kernels: the compressor steps
(v4serve/ops/compress_verify_triton.py) and the state commit (v4serve/ops/state_commit_triton.py),
in their own file so merges with other registry edits stay trivial; registry.py appends
SPEC_VERIFY_KERNELS.

Shapes: V4-Flash's CSA kv compressor (overlap, ratio 4, head_dim 512) and HCA compressor (online,
ratio 128, head_dim 512), writing packed fp8_e8m0_b64_rope64 rows (the GPU default cache) and the
rollback's undo journal (SAVE: the sub-rows each group overwrites, stored beside the step's own
loads). The groups loop is a runtime loop (k + 1 groups, any k). Registers measured under Triton
3.6 / 3.8 / 3.9 before the journal (bounds ~10% above the most): CSA 139-216 by arch and version
(the decode kernel: 124-130; the groups loop keeps the pooling tiles of the overlap step live
longer), no spills; HCA 54-64, with an 8-byte spill (2 STL/LDL) on sm_80 under 3.6 only. With the
journal, under 3.6 (`v4serve.codegen --arch 90,80`): CSA 203 / 207 (sm_90 / sm_80), HCA 80, no
spills (the copy loops are gone); 3.8 / 3.9 not measured yet. Registers cost nothing here: one
CTA per sequence. The journal's loads and the state stores over them share one layout per shape
(checked in the TTGIR: the 1-D rows one blocked layout, the [r, 512] tiles another), so each
pre-image is read by the thread that then overwrites it.
The commit reads its pointers from an int64 table (int -> pointer casts) and copies the journal's
marked fp32 sub-rows.
"""
from v4serve.formats import row_format
from v4serve.ops.kv_pack_triton import packed_constexprs
from v4serve.ops.state_commit_triton import BLOCK as COMMIT_BLOCK

from .registry_packed_kv import COMPRESS_DECODE_ALIGNED, compress_decode_types
from .spec import Expect, KernelSpec

_OPS = "v4serve.ops"
_FP8 = packed_constexprs(row_format("fp8_e8m0_b64_rope64"), 512)

SPEC_VERIFY_KERNELS: tuple[KernelSpec, ...] = (
    *(
        KernelSpec(
            f"compress_verify.{kind}_fp8kv", f"{_OPS}.compress_verify_triton:_compress_verify_kernel",
            types=compress_decode_types(pool_ptr="*u8", saved_ptr="*fp32", written_ptr="*i32", S="i32", groups="i32",
                                        stride_saved="i32", stride_written="i32"),
            aligned=(*COMPRESS_DECODE_ALIGNED, "stride_pool", "saved_ptr", "written_ptr", "stride_saved"),
            constexprs=dict(PDL=False, RATIO=ratio, OVERLAP=overlap, BLOCK_R=block_r, BLOCK_D=512, SAVE=True,
                            PACKED=True, **_FP8, HADAMARD=False, LOG2_D=0),
            num_warps=4, num_stages=1, expect=expect,
        )
        for kind, ratio, overlap, block_r, expect in (
            ("csa", 4, True, 4, Expect(max_regs=240)),
            ("hca", 128, False, 1, Expect(max_regs=88, max_spill_ops=2)),
        )
    ),
    KernelSpec(
        "state_commit", "v4serve.ops.state_commit_triton:_state_commit_kernel",
        types=dict(table_ptr="*i64", slots_ptr="*i64", accepted_ptr="*i64"),
        aligned=("table_ptr", "slots_ptr", "accepted_ptr"),
        constexprs=dict(BLOCK=COMMIT_BLOCK, PDL=False), num_warps=4, num_stages=1, expect=Expect(max_regs=128),
    ),
)
