"""Codegen registry entries of the MXFP4 GEMV kernel (v4serve/ops/mxfp4_gemv_triton.py), in their
own file so merges with other registry edits stay trivial; registry.py appends MXFP4_GEMV_KERNELS.

Shapes: V4-Flash, 256 experts, bf16 activations: gate_up [256, 4096, 4096 / 2] with the SwiGLU
epilogue (rows read from the sorted pick list) and down [256, 4096, 2048 / 2], at the tiles the
wrapper uses (`gemv_config`), for 1 pick a program (c1, c8) and 2 (c64), with
the PTX word decoder (production on CUDA; the integer one, a bench variant, compiles too: 80-250
registers, no spills, under 3.6 / 3.8 / 3.9, not registered to keep CI's compile time). Weight words are 16-byte loads; the
scale bytes and the activations are narrower loads (one byte per 32-element block; 16-byte rows of
x: 8-byte words), so no kv_load_bytes check. No tensor cores (FFMA only). Registers measured under
Triton 3.6 / 3.8 / 3.9: 1 pick 95-128 (64 / 2 x 32 rows), 2 picks on 32 / 2 x 16 rows 96-128 (on
64 rows it was 212-231).
"""
from v4serve.ops.mxfp4_gemv_triton import gemv_config
from v4serve.ops.mxfp4_moe_mma_triton import mma_config

from .spec import Expect, KernelSpec

MXFP4_GEMV_KERNELS: tuple[KernelSpec, ...] = tuple(
    KernelSpec(
        f"moe.mxfp4_gemv_{proj}_p{picks}_{decode}", "v4serve.ops.mxfp4_gemv_triton:_mxfp4_gemv_kernel",
        types=dict(x_ptr="*bf16", w_ptr="*u8", s_ptr="*u8", rows_ptr="*i64", ends_ptr="*i32", y_ptr="*bf16",
                   N="i32", K="i32", K_SCALES="i32", stride_x="i32", stride_we="i32", stride_wn="i32",
                   stride_se="i32", stride_sn="i32", stride_y="i32", limit="fp32"),
        aligned=("x_ptr", "w_ptr", "s_ptr", "rows_ptr", "ends_ptr", "y_ptr", "N", "K", "K_SCALES", "stride_x",
                 "stride_we", "stride_wn", "stride_se", "stride_sn", "stride_y"),
        constexprs=dict(PDL=False, N_GROUPS=256, HAS_ROWS=proj == "gate_up", X_WORDS=True, DECODE_ASM=decode == "asm",
                        SWIGLU=proj == "gate_up", EVEN_K=True, PICKS=picks, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"],
                        BLOCK_E=256),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        expect=Expect(max_regs=141),
    )
    for proj in ("gate_up", "down")
    for picks in (1, 2)
    for cfg in (gemv_config(picks, proj == "gate_up"),)
    for decode in ("asm",)
)

# The sort-free decode kernel (v4serve/ops/mxfp4_moe_decode_triton.py): one pick a program, the
# expert id read from the router's [T * 6] picks; gate_up with the SwiGLU (x row per token), down
# (x row per pick) alone and with the combine by the last arrival (bf16 add, fp32 weights, int32
# tickets), at production's one-pick tiles; and the sweep's AHEAD = 2 (one more register buffer of
# weight words) for both, down with EARLY (weights before the PDL wait, so PDL on). sm_90, Triton
# 3.6: 113-118 registers at AHEAD 1 (the sorted GEMV: 117-124), 779 / 837 SASS instructions for
# down / gate_up against the sorted GEMV's 926 / 987 (the group-ends scan gone from the prologue).
# `_skip`: an offloaded layer's passes (model/quantized_offload.py) at production's tiles: a program
# whose expert id is past the weight's rows returns after reading it (sm_90, Triton 3.6: the same
# registers, 5 more SASS instructions, the compare and the exit; so do the tensor-core `_skip` rows).
_MOE_DECODE_TYPES = dict(x_ptr="*bf16", w_ptr="*u8", s_ptr="*u8", experts_ptr="*i64", y_ptr="*bf16", cw_ptr="*fp32",
                         add_ptr="*bf16", out_ptr="*bf16", arrivals_ptr="*i32", N="i32", K="i32", K_SCALES="i32",
                         stride_x="i32", stride_we="i32", stride_wn="i32", stride_se="i32", stride_sn="i32",
                         stride_y="i32", stride_a="i32", limit="fp32", n_rows="i32")
_MOE_DECODE_ALIGNED = ("x_ptr", "w_ptr", "s_ptr", "experts_ptr", "y_ptr", "cw_ptr", "add_ptr", "out_ptr", "arrivals_ptr",
                       "N", "K", "K_SCALES", "stride_x", "stride_we", "stride_wn", "stride_se", "stride_sn", "stride_y",
                       "stride_a")
MXFP4_MOE_DECODE_KERNELS: tuple[KernelSpec, ...] = tuple(
    KernelSpec(
        f"moe.mxfp4_decode_{proj}{'_combine' if combine else ''}{f'_ahead{ahead}' if ahead > 1 else ''}"
        f"{'_skip' if skip else ''}",
        "v4serve.ops.mxfp4_moe_decode_triton:_mxfp4_moe_pick_kernel",
        types=_MOE_DECODE_TYPES, aligned=_MOE_DECODE_ALIGNED,
        constexprs=dict(PDL=ahead > 1 and proj == "down", TOP_K=6, X_PER_TOKEN=proj == "gate_up",
                        X_WORDS=True, DECODE_ASM=True, SWIGLU=proj == "gate_up", EVEN_K=True, COMBINE=combine,
                        HAS_ADD=combine, BLOCK_N=cfg["BLOCK_N"], BLOCK_K=cfg["BLOCK_K"], AHEAD=ahead,
                        EARLY=ahead > 1 and proj == "down", SKIP_PAST_ROWS=skip),
        archs=(90, 100, 120) if ahead > 1 and proj == "down" else None,  # PDL: griddepcontrol is sm_90+
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        # AHEAD 2 holds a third register buffer (sm_90, Triton 3.6: gate_up 138 registers; down capped
        # at 128 with 8 B spilled, one LDL in the K loop, and so is gate_up on sm_80: a bench
        # variant, 632 / 629 instructions a K step against 594 / 606 at AHEAD 1)
        expect=Expect(max_regs=168 if ahead > 1 else 141, max_spill_ops=4 if ahead > 1 else 0),
    )
    for proj, combine, skip in (("gate_up", False, False), ("down", False, False), ("down", True, False),
                                ("gate_up", False, True), ("down", False, True))
    for ahead in ((1,) if skip else (1, 2))
    for cfg in (gemv_config(1, proj == "gate_up"),)
    if not (combine and ahead > 1)
)

# Both tensor-core decode kernels below (tl and Gluon) take the same arguments.
_MMA_TYPES = dict(x_ptr="*bf16", w_ptr="*u8", s_ptr="*u8", experts_ptr="*i64", y_ptr="*bf16", N="i32", K="i32",
                  stride_x="i32", stride_we="i32", stride_wn="i32", stride_se="i32", stride_sn="i32", stride_y="i32",
                  limit="fp32", n_rows="i32")
_MMA_ALIGNED = tuple(name for name in _MMA_TYPES if name not in ("limit", "n_rows"))

# The tensor-core decode projection (v4serve/ops/mxfp4_moe_mma_triton.py, issue 18; the decode route of
# `mxfp4_experts(tensor_cores=True)`, off in production: ops/mxfp4_moe_decode.TENSOR_CORE_DECODE):
# the decoded bf16 weights are wgmma's register operand (HGMMA 64x16x16, A from registers), x and
# its 15 zero columns the shared-memory one. sm_90, Triton 3.6: 127 registers, no spills, 8 KB of
# shared memory, K loop 466 SASS instructions for 128 weights a thread (3.64 a weight; docs/performance.md).
MXFP4_MOE_MMA_KERNELS: tuple[KernelSpec, ...] = tuple(
    KernelSpec(
        f"moe.mxfp4_mma_{proj}{'_skip' if skip else ''}", "v4serve.ops.mxfp4_moe_mma_triton:_mxfp4_moe_mma_kernel",
        types=_MMA_TYPES, aligned=_MMA_ALIGNED,
        constexprs=dict(PDL=False, TOP_K=6, X_PER_TOKEN=proj == "gate_up", DECODE_ASM=True, SWIGLU=proj == "gate_up",
                        BLOCK_OUT=cfg["BLOCK_OUT"], BLOCK_K=cfg["BLOCK_K"], SKIP_PAST_ROWS=skip),
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        expect=Expect(max_regs=168, tensor_cores=True),
    )
    for proj in ("gate_up", "down")
    for skip in (False, True)  # skip: an offloaded layer's passes
    for cfg in (mma_config(proj == "gate_up"),)
)

# The same projection in Gluon (v4serve/ops/mxfp4_moe_mma_gluon.py, sm_90 only; the route's kernel
# there, where its shapes fit): the bytes loaded in the layout whose decoded registers are wgmma's A
# fragment (no shared-memory re-layout), X's zero columns in a 4 KB tile per operand (x: one 16-byte
# load a row-0 thread a step; rows 8..15 zeroed once). sm_90, Triton 3.6, STAGES 0 (the register
# loop, past 512 picks): 128 registers, no spills; two K steps an iteration (both loaded first): 727 /
# 726 SASS instructions (down / gate_up) for 256 weights a thread (2.85 a weight). STAGES 4 (production
# up to 512 picks): a ring of cp.async shared-memory stages (16-byte copies of the bytes, 4-byte copies
# of the scales), one step an iteration: 116 / 125 registers, 43 KB of shared memory, 2.98 instructions
# a weight. GROUPED: a program serves up to 8 picks of its expert (X's rows 0..7) as the launch's
# moe_pick_groups table says; production past 48 picks (verify batches, c64), on the ring.
# As production launches them: gate_up with WAIT_FIRST and TRIGGER (griddepcontrol.wait, then
# launch_dependents), down with PDL (its first weight stages requested before griddepcontrol.wait;
# its TRIGGER, set when its grid is one wave, is one instruction more).
_GLUON_TYPES = dict(_MMA_TYPES, members_ptr="*i32")
MXFP4_MOE_MMA_KERNELS += tuple(
    KernelSpec(
        f"moe.mxfp4_mma_gluon_{proj}{'_skip' if skip else ''}{f'_stages{stages}' if stages else ''}"
        f"{'_grouped' if grouped else ''}",
        "v4serve.ops.mxfp4_moe_mma_gluon:_mxfp4_moe_mma_gluon_kernel",
        types=_GLUON_TYPES, aligned=_MMA_ALIGNED,
        constexprs=dict(TOP_K=6, X_PER_TOKEN=proj == "gate_up", SWIGLU=proj == "gate_up", SKIP_PAST_ROWS=skip,
                        STAGES=stages, GROUPED=grouped, TRIGGER=proj == "gate_up", PDL=proj == "down",
                        WAIT_FIRST=proj == "gate_up"),
        archs=(90,), num_warps=4, num_stages=1,
        expect=Expect(max_regs=168, tensor_cores=True),
    )
    for stages, grouped in ((0, False), (4, False), (4, True))  # grouped: > 48 picks
    for proj in ("gate_up", "down")
    for skip in (False, True)  # skip: an offloaded layer's passes
)

# The Gluon projection's pick-groups table (v4serve/ops/moe_pick_groups_triton.py): one launch a
# grouped decode layer, [32, 64] expert-id compares a step over the launch's picks, the later picks
# of each pick scattered to their slots.
MXFP4_MOE_MMA_KERNELS += (
    KernelSpec(
        "moe.pick_groups", "v4serve.ops.moe_pick_groups_triton:_moe_pick_groups_kernel",
        types=dict(experts_ptr="*i64", members_ptr="*i32", P="i32"), aligned=("experts_ptr", "members_ptr"),
        constexprs=dict(GROUP=8, BLOCK_P=32, BLOCK_Q=64), num_warps=8, num_stages=1, expect=Expect(max_regs=128),
    ),
)
