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
