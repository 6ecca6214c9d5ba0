"""Every Triton kernel the codegen check compiles: one ``KernelSpec`` entry per kernel.

To add a kernel, append one entry to ``KERNELS`` (see docs/codegen.md):

- ``fn``: where the ``@triton.jit`` function lives, ``"module:name"``;
- ``types`` of its runtime arguments, and which of them are ``aligned`` (16-byte-aligned
  pointers, integer strides that are multiples of 16), exactly as the wrapper launches it;
- ``constexprs``, ``num_warps`` and ``num_stages`` of the production tile configuration;
- ``expect``: the load width of its KV gathers, a register bound, whether it has a ``tl.dot``.

Tile configurations are copied from the launching wrapper; each entry says which one.
"""
from v4serve.ops.fp8_linear_triton import FP8_DECODE_CONFIG as _FP8_DECODE
from v4serve.ops.fp8_linear_triton import FP8_PREFILL_CONFIG as _FP8_PREFILL
from v4serve.ops.fp8_linear_triton import FP8_PREFILL_DEQUANT_CONFIG as _FP8_PREFILL_DEQUANT
from v4serve.ops.fp8_linear_triton import FP8_PREFILL_SM80_CONFIG as _FP8_PREFILL_SM80
from v4serve.ops.hc_coefficients_triton import HC_CONFIG
from v4serve.ops.hc_mix_triton import HC_MIX_CONFIGS
from v4serve.ops.indexer_triton import DECODE_CONFIG as INDEX_DECODE_CONFIG
from v4serve.ops.indexer_triton import PREFILL_CONFIG as INDEX_PREFILL_CONFIG
from v4serve.ops.indexer_triton import PREFILL_CONFIG_Q2 as INDEX_PREFILL_CONFIG_Q2
from v4serve.ops.mxfp4_grouped_matmul_triton import MXFP4_DECODE_CONFIG as _MXFP4_DECODE
from v4serve.ops.mxfp4_grouped_matmul_triton import MXFP4_DECODE_SWIGLU_CONFIG as _MXFP4_DECODE_SWIGLU
from v4serve.ops.mxfp4_grouped_matmul_triton import MXFP4_PREFILL_CONFIG as _MXFP4_PREFILL
from v4serve.ops.mxfp4_grouped_matmul_triton import MXFP4_PREFILL_SWIGLU_CONFIG as _MXFP4_PREFILL_SWIGLU
from v4serve.ops.sparse_attn_gluon import MAX_REGS as WS_MAX_REGS
from v4serve.ops.sparse_attn_triton import (
    DECODE_CONFIG_SMALL, DECODE_CONFIG_TWO_PASS, PREFILL_CONFIG_WS, PREFILL_CONFIGS)

from .spec import Expect, KernelSpec
from .registry_decode_fusion import DECODE_FUSION_KERNELS
from .registry_fp8_decode import FP8_DECODE_KERNELS
from .registry_fp8_rows32 import FP8_ROWS32_KERNELS
from .registry_fp8_swiglu import FP8_SWIGLU_KERNELS
from .registry_index_topk import INDEX_TOPK_KERNELS
from .registry_kv_compact import KV_COMPACT_KERNELS
from .registry_launch_glue import LAUNCH_GLUE_KERNELS
from .registry_mxfp4_gemv import MXFP4_GEMV_KERNELS, MXFP4_MOE_DECODE_KERNELS, MXFP4_MOE_MMA_KERNELS
from .registry_spec_verify import SPEC_VERIFY_KERNELS
from .registry_packed_kv import (COMPRESS_DECODE_ALIGNED, INDEX_ALIGNED, INDEX_TYPES, PACKED_KV_KERNELS,
                                 compress_decode_types)
from .registry_v41_engine import V41_ENGINE_KERNELS
from .registry_v41_index import V41_INDEX_KERNELS

_CANARY = "v4serve.codegen.samples"
# The packed-row constexprs (issue 17) at their bf16-pool defaults: every kernel that can read or
# write packed rows takes them; the packed entries live in registry_packed_kv.py.
_NO_PK = dict(PACKED=False, PK_FP4=False, PK_NQ=0, PK_BLOCK=1, PK_TAIL_OFF=0, PK_SCALE_OFF=0, PK_HAS_TAIL=False,
              PK_PAYLOAD=0, PK_ROW_BYTES=0)
_NO_PK_LOAD = dict(PACKED=False, PK_NQ=0, PK_BLOCK=1, PK_TAIL_OFF=0, PK_SCALE_OFF=0, PK_HAS_TAIL=False,
                   PK_FP8_CVT=False)
_TWO_PASS = DECODE_CONFIG_TWO_PASS
_DECODE = DECODE_CONFIG_SMALL
_MIX = HC_MIX_CONFIGS
_OPS = "v4serve.ops"

_SPARSE_ATTN_TYPES = dict(
    q_ptr="*bf16", win_ptr="*bf16", cmp_ptr="*bf16", idx_ptr="*i32", counts_ptr="*i32",
    sink_ptr="*fp32", out_ptr="*bf16", ticket_ptr="*i32", H="i32", D="i32", C="i32",
    n_window="i32", cols_per_split="i32", wide_from="i32", wide_cols_per_split="i32", n_splits="i32",
    qk_scale_log2="fp32", **dict.fromkeys(
        ("stride_qt", "stride_qh", "stride_pool", "stride_it", "stride_ot", "stride_oh",
         "stride_pt", "stride_ps", "stride_ph", "stride_mt", "stride_ms"), "i32"))
# Every pointer (pools asserted 16-byte aligned, the rest fresh allocations) and every integer
# that is a multiple of 16 at the DeepSeek-V4 shapes (H 64, D 512, C 640, n_window 128).
_SPARSE_ATTN_ALIGNED = (
    "q_ptr", "win_ptr", "cmp_ptr", "idx_ptr", "counts_ptr", "sink_ptr", "out_ptr", "part_ptr",
    "m_ptr", "l_ptr", "ticket_ptr", "H", "D", "C", "n_window", "cols_per_split", "wide_from",
    "wide_cols_per_split", "stride_qt", "stride_qh", "stride_pool", "stride_it", "stride_ot", "stride_oh",
    "stride_pt", "stride_ps", "stride_ph", "stride_mt", "stride_ms")
_SPARSE_ATTN_WS_TYPES = dict(
    q_ptr="*bf16", win_ptr="*bf16", cmp_ptr="*bf16", idx_ptr="*i32", counts_ptr="*i32", sink_ptr="*fp32",
    out_ptr="*bf16", part_ptr="*bf16", m_ptr="*bf16", l_ptr="*bf16", H="i32", C="i32", n_window="i32",
    n_hblocks="i32", cols_per_split="i32", n_work="i32", qk_scale_log2="fp32", **dict.fromkeys(
        ("stride_qt", "stride_qh", "stride_pool", "stride_it", "stride_ot", "stride_oh",
         "stride_pt", "stride_ps", "stride_ph", "stride_mt", "stride_ms"), "i32"))
# Prefill launch (no split: n_splits is 1, which the JIT specializes): the partial pointers are
# `out` again and their strides 0.
_SPARSE_ATTN_WS_ALIGNED = (
    "q_ptr", "win_ptr", "cmp_ptr", "idx_ptr", "counts_ptr", "sink_ptr", "out_ptr", "part_ptr", "m_ptr",
    "l_ptr", "H", "C", "n_window", "cols_per_split", "stride_qt", "stride_qh", "stride_pool", "stride_it",
    "stride_ot", "stride_oh", "stride_pt", "stride_ps", "stride_ph", "stride_mt", "stride_ms")
_MERGE_TYPES = dict(
    part_ptr="*fp32", m_ptr="*fp32", l_ptr="*fp32", sink_ptr="*fp32", out_ptr="*bf16", counts_ptr="*i32", H="i32",
    D="i32", C="i32", n_window="i32", cols_per_split="i32", wide_from="i32", wide_cols_per_split="i32",
    n_splits="i32", **dict.fromkeys(
        ("stride_pt", "stride_ps", "stride_ph", "stride_mt", "stride_ms", "stride_ot", "stride_oh"),
        "i32"))
_MERGE_ALIGNED = ("part_ptr", "m_ptr", "l_ptr", "sink_ptr", "out_ptr", "H", "D", "stride_pt",
                  "stride_ps", "stride_ph", "stride_mt", "stride_ms", "stride_ot", "stride_oh")
_TWO_PASS_STRIDES = ("stride_pool", "stride_it", "stride_pt", "stride_ph", "stride_mt", "stride_mj")
_SCORES_TYPES = dict(
    q_ptr="*bf16", win_ptr="*bf16", cmp_ptr="*bf16", idx_ptr="*i32", counts_ptr="*i32", sink_ptr="*fp32",
    p_ptr="*bf16", m_ptr="*fp32", l_ptr="*fp32", rows_ptr="*bf16", H="i32", D="i32", C="i32", n_window="i32",
    qk_scale_log2="fp32", **dict.fromkeys(("stride_qt", "stride_qh", *_TWO_PASS_STRIDES, "stride_rt"), "i32"))
_VALUES_TYPES = dict(
    win_ptr="*bf16", cmp_ptr="*bf16", idx_ptr="*i32", counts_ptr="*i32", sink_ptr="*fp32", p_ptr="*bf16",
    m_ptr="*fp32", l_ptr="*fp32", out_ptr="*bf16", H="i32", D="i32", C="i32", n_window="i32",
    **dict.fromkeys((*_TWO_PASS_STRIDES, "stride_ot", "stride_oh", "stride_rt"), "i32"))
# H 64, D 512, C 640, 10 tiles of 64: every pointer and integer but qk_scale_log2 is 16-aligned.
_SCORES_ALIGNED = tuple(k for k in _SCORES_TYPES if k != "qk_scale_log2")
_VALUES_ALIGNED = tuple(_VALUES_TYPES)
_KV_QUANT_TYPES = dict(x_ptr="*bf16", out_ptr="*bf16", n_rows="i32", D="i32", N_QUANT="i32",
                       stride_x="i32", stride_o="i32")
_KV_QUANT_ALIGNED = ("x_ptr", "out_ptr", "D", "N_QUANT", "stride_x", "stride_o")
_GATED_POOL_TYPES = dict(kv_ptr="*fp32", score_ptr="*fp32", out_ptr="*bf16", R="i32", D="i32",
                         stride_kb="i32", stride_kr="i32", stride_sb="i32", stride_sr="i32",
                         stride_ob="i32")
_GATED_POOL_ALIGNED = ("kv_ptr", "score_ptr", "out_ptr", "D", "stride_kb", "stride_kr",
                       "stride_sb", "stride_sr", "stride_ob")

_NORM_ROPE_TYPES = dict(x_ptr="*bf16", w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", out_ptr="*bf16",
                        pool_ptr="*bf16", pool_rows_ptr="*bf16", D="i32", R="i32", heads="i32", eps="fp32",
                        stride_x="i32", stride_o="i32", stride_cs="i32", stride_pool="i32")
# Without a packed store the launch passes the rows again as pool_ptr / pool_rows_ptr and stride_pool 0.
_NORM_ROPE_ALIGNED = ("x_ptr", "w_ptr", "cos_ptr", "sin_ptr", "out_ptr", "pool_ptr", "pool_rows_ptr", "D", "stride_x",
                      "stride_o", "stride_pool")

_HC_MIX_TYPES = dict(x_ptr="*bf16", fn_ptr="*fp32", part_ptr="*fp32", mix_ptr="*fp32", row_scale_ptr="*fp32",
                     ticket_ptr="*i32", base_ptr="*fp32", scale_ptr="*fp32", pre_ptr="*fp32", post_ptr="*fp32",
                     comb_ptr="*fp32", T="i32", K="i32", M="i32", k_per_split="i32", n_splits="i32", eps="fp32",
                     stride_x="i32")
# M = 24 and T are not multiples of 16; K = 16384, k_per_split and the row stride are. The
# coefficient pointers (the epilogue's; the mixes again without it) are fresh allocations.
_HC_MIX_ALIGNED = ("x_ptr", "fn_ptr", "part_ptr", "mix_ptr", "row_scale_ptr", "ticket_ptr", "base_ptr", "scale_ptr",
                   "pre_ptr", "post_ptr", "comb_ptr", "K", "k_per_split", "stride_x")
# The coefficients epilogue as the model runs it (hc_stream_coefficients): V4's 4 streams, 20 rounds;
# off, the mixer alone (the head's collapse weights).
_HC_COEFFS = dict(COEFFS=True, N=4, ITERS=20, HC_EPS=1e-6, HEAD_PRE=False)
_NO_HC_COEFFS = dict(COEFFS=False, N=1, ITERS=1, HC_EPS=0.0, HEAD_PRE=False, COEFF_T=16)
# The head's mixer (fn [4, 16384]) with its pre epilogue (ops/hc_head_pre.py), 2-token sub-blocks.
_HC_HEAD_PRE = dict(COEFFS=False, N=4, ITERS=1, HC_EPS=1e-6, HEAD_PRE=True, COEFF_T=2)
# The Walsh-Hadamard epilogue of norm_rope / compress_decode (registry_decode_fusion.py), off.
_NO_HADAMARD = dict(HADAMARD=False, LOG2_D=0)

# Without a packed store pool_ptr is the rows again and stride_pool 0.
_COMPRESS_DECODE_TYPES = compress_decode_types(pool_ptr="*bf16")
_COMPRESS_DECODE_ALIGNED = (*COMPRESS_DECODE_ALIGNED, "stride_pool")
# Register bounds, per arch, about 10% above the most measured under Triton 3.6 / 3.8 / 3.9
# (docs/codegen.md): prefill 183 / 195 (32 heads; 3.9) / 184 / 169, decode 151 / 150 / 138 / 147.
# Quantized-weight kernels: ~1.1 x the registers measured under Triton 3.6 (255 = the hardware
# maximum, where the no-spill check is the bound: the sm_80 prefill decodes both operands from bytes;
# the MXFP4 prefill on sm_100: 1.1 x Triton 3.8's 162).
_QUANT_MAX_REGS = {
    "decode_w8a16": {90: 96, 100: 96, 120: 96}, "decode_w8a16_sm80": {80: 100},
    "decode_w8a8": {90: 96, 100: 96, 120: 72}, "decode_w8a8_sm80": {80: 96},
    "decode_m64_w8a16": {90: 144, 100: 168, 120: 192}, "decode_m64_w8a8": {90: 144, 100: 168, 120: 192},
    "prefill_w8a16": {90: 240, 100: 255, 120: 246}, "prefill_w8a16_sm80": {80: 255},
    "prefill_w8a8": {90: 251, 100: 255, 120: 255}, "prefill_w8a8_sm80": {80: 255},
    "mxfp4_decode": {80: 141, 90: 141, 100: 139, 120: 141},
    "mxfp4_prefill": {80: 255, 90: 181, 100: 179, 120: 251},
}
_PREFILL_MAX_REGS = {80: 202, 90: 215, 100: 203, 120: 186}
_DECODE_MAX_REGS = {80: 167, 90: 165, 100: 152, 120: 162}
KERNELS: tuple[KernelSpec, ...] = (
    # ---- canaries: fixed copies of the production access patterns (samples.py) ----
    KernelSpec(
        "canary.gather_rows", f"{_CANARY}:_gather_rows_kernel",
        types=dict(src_ptr="*bf16", idx_ptr="*i32", out_ptr="*bf16", num_rows="i32",
                   stride_src="i32", stride_out="i32"),
        aligned=("src_ptr", "idx_ptr", "out_ptr", "stride_src", "stride_out"),
        constexprs=dict(BLOCK_M=32, D=512), num_warps=4, num_stages=1,
        expect=Expect(kv_load_bytes=16, kv_lines=r"^x = tl\.load", max_regs=128),
    ),
    KernelSpec(
        "canary.window_gather", f"{_CANARY}:_window_gather_kernel",
        types=dict(win_ptr="*bf16", cmp_ptr="*bf16", idx_ptr="*i32", out_ptr="*bf16",
                   n_window="i32", stride_row="i32"),
        aligned=("win_ptr", "cmp_ptr", "idx_ptr", "out_ptr", "stride_row"),
        constexprs=dict(BLOCK_N=32, D=512), num_warps=4, num_stages=1,
        expect=Expect(kv_load_bytes=16, kv_lines=r"kv = tl\.load", max_regs=128),
    ),
    KernelSpec(
        "canary.word_gather", f"{_CANARY}:_word_gather_kernel",
        types=dict(pool_ptr="*i32", idx_ptr="*i32", out_ptr="*i32", stride_row_words="i32"),
        aligned=("pool_ptr", "idx_ptr", "out_ptr"),  # stride 17 words: 4-byte aligned only
        constexprs=dict(BLOCK_N=64, WORDS=17, WORDS_POW2=32), num_warps=4, num_stages=1,
        expect=Expect(kv_load_bytes=4, kv_lines=r"words = tl\.load", max_regs=128),
    ),
    KernelSpec(
        "canary.score_tile", f"{_CANARY}:_score_tile_kernel",
        types=dict(q_ptr="*bf16", k_ptr="*bf16", out_ptr="*fp32", num_keys="i32",
                   stride_q="i32", stride_k="i32"),
        aligned=("q_ptr", "k_ptr", "out_ptr", "stride_q", "stride_k"),
        constexprs=dict(BLOCK_M=64, BLOCK_N=64, D=512, BLOCK_D=64), num_warps=4, num_stages=2,
        expect=Expect(kv_load_bytes=16, max_regs=168, tensor_cores=True),
    ),
    # ---- sparse attention (ops/sparse_attn_triton.py), DeepSeek-V4: H 64, D 512, window 128,
    # top-k 512 -> C = 640 columns; PREFILL_CONFIGS and decode_config(n_tokens, n_columns) ----
    *(
        KernelSpec(  # PREFILL_CONFIGS[arch]; no split, so the launch passes n_splits 1 and `out` as
            # the partial and ticket pointers
            f"sparse_attn.prefill_sm{arch}", f"{_OPS}.sparse_attn_triton:_sparse_attn_kernel",
            types=dict(_SPARSE_ATTN_TYPES, part_ptr="*bf16", m_ptr="*bf16", l_ptr="*bf16", ticket_ptr="*bf16"),
            aligned=_SPARSE_ATTN_ALIGNED,
            constexprs=dict(n_splits=1, HAS_COUNTS=False, SPLIT=False, FUSED_MERGE=False, BLOCK_H=cfg["BLOCK_H"],
                            BLOCK_T=cfg["BLOCK_T"], BLOCK_D=512, PDL=False, EVEN_D=True, PK_FP8_CVT=False,
                            PK_BF16_OPERAND=False, **_NO_PK),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], archs=(arch,),
            # The 64-head tile (sm_90 before Triton 3.9) is meant to fill the register file: its
            # [64, 512] fp32 accumulator over 256 threads compiles to 255 registers, the hardware's
            # maximum, so what bounds it is the no-spill expectation (3.9's ptxas spills it).
            expect=Expect(kv_load_bytes=16, kv_lines=r"kv = tl\.load", tensor_cores=True,
                          max_regs=255 if cfg["BLOCK_H"] == 64 else _PREFILL_MAX_REGS[arch]),
        )
        for arch, cfg in PREFILL_CONFIGS.items()
    ),
    KernelSpec(  # PREFILL_CONFIG_WS: the warp-specialised Gluon kernel, production prefill on sm_90
        "sparse_attn.prefill_ws", f"{_OPS}.sparse_attn_gluon:_sparse_attn_ws_kernel",
        types=dict(_SPARSE_ATTN_WS_TYPES), aligned=_SPARSE_ATTN_WS_ALIGNED,
        constexprs=dict(n_splits=1, HAS_COUNTS=True, SPLIT=False, BLOCK_T=PREFILL_CONFIG_WS["BLOCK_T"], D=512,
                        KV_STAGES=PREFILL_CONFIG_WS["KV_STAGES"]),
        num_warps=4, num_stages=1, maxnreg=WS_MAX_REGS, archs=(90,),
        # Registers: the kernel takes the whole register file on purpose. Every thread starts at
        # maxnreg, and the setmaxnreg budgets (producer 24, two consumers 240) add up to the same
        # 384 x 168 = 64512 of 65536 registers, so the bound is maxnreg: ptxas must honour it.
        # Spills: the 24-register producer keeps a few loop scalars in local memory, and each
        # consumer saves ~6 per-item values around its tile loop, whose body has none (SASS,
        # 77 / 56 / 30 STL/LDL instructions in all under Triton 3.6 / 3.8 / 3.9).
        expect=Expect(kv_load_bytes=16, kv_lines=r"cp_async\(kv_smem", max_regs=WS_MAX_REGS, tensor_cores=True,
                      max_spill_ops=96),
    ),
    *(
        KernelSpec(  # DECODE_CONFIG_SMALL (_LARGE and _LIVE differ only in the runtime split widths:
            # cols_per_split, wide_from, wide_cols_per_split), merge kernel after; PDL on sm_90+
            # (griddepcontrol needs sm_90)
            f"sparse_attn.decode{suffix}", f"{_OPS}.sparse_attn_triton:_sparse_attn_kernel",
            types=dict(_SPARSE_ATTN_TYPES, part_ptr="*fp32", m_ptr="*fp32", l_ptr="*fp32"),
            aligned=_SPARSE_ATTN_ALIGNED,
            constexprs=dict(HAS_COUNTS=True, SPLIT=True, FUSED_MERGE=False, BLOCK_H=_DECODE["BLOCK_H"],
                            BLOCK_T=_DECODE["BLOCK_T"], BLOCK_D=512, PDL=pdl, EVEN_D=True, PK_FP8_CVT=False,
                            PK_BF16_OPERAND=False, **_NO_PK),
            num_warps=_DECODE["num_warps"], num_stages=_DECODE["num_stages"], archs=archs,
            expect=Expect(kv_load_bytes=16, kv_lines=r"kv = tl\.load", max_regs=_DECODE_MAX_REGS, tensor_cores=True),
        )
        for suffix, pdl, archs in (("", False, None), ("_pdl", True, (90, 100, 120)))
    ),
    KernelSpec(  # B1 r4: 640 columns / 32 per split = 20 splits -> BLOCK_S 32; the [32, 512]
        # fp32 tile alone is 128 registers per thread
        "sparse_attn.merge_s32", f"{_OPS}.sparse_attn_triton:_sparse_attn_merge_kernel",
        types=_MERGE_TYPES, aligned=_MERGE_ALIGNED,
        constexprs=dict(HAS_COUNTS=True, BLOCK_S=32, BLOCK_D=512, PDL=False, ROUNDS=False), num_warps=4, num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"part = tl\.load", max_regs=192),
    ),
    KernelSpec(  # merge_s32 with PDL=True (launched with launch_pdl on sm_90+)
        "sparse_attn.merge_s32_pdl", f"{_OPS}.sparse_attn_triton:_sparse_attn_merge_kernel",
        types=_MERGE_TYPES, aligned=_MERGE_ALIGNED,
        constexprs=dict(HAS_COUNTS=True, BLOCK_S=32, BLOCK_D=512, PDL=True, ROUNDS=False), archs=(90, 100, 120), num_warps=4,
        num_stages=3, expect=Expect(kv_load_bytes=16, kv_lines=r"part = tl\.load", max_regs=192),
    ),
    KernelSpec(  # more than 32 splits (a wide cache's HCA rows at B1): 32 a round
        "sparse_attn.merge_s32_rounds_pdl", f"{_OPS}.sparse_attn_triton:_sparse_attn_merge_kernel",
        types=_MERGE_TYPES, aligned=_MERGE_ALIGNED,
        constexprs=dict(HAS_COUNTS=True, BLOCK_S=32, BLOCK_D=512, PDL=True, ROUNDS=True), archs=(90, 100, 120), num_warps=4,
        num_stages=3, expect=Expect(kv_load_bytes=16, kv_lines=r"part = tl\.load", max_regs=192),
    ),
    KernelSpec(  # B1 r128: 384 columns / 32 per split = 12 splits -> BLOCK_S 16
        "sparse_attn.merge_s16", f"{_OPS}.sparse_attn_triton:_sparse_attn_merge_kernel",
        types=_MERGE_TYPES, aligned=_MERGE_ALIGNED,
        constexprs=dict(HAS_COUNTS=True, BLOCK_S=16, BLOCK_D=512, PDL=False, ROUNDS=False), num_warps=4, num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"part = tl\.load", max_regs=128),
    ),
    # ---- two-pass decode (ops/sparse_attn_two_pass.py), DECODE_CONFIG_TWO_PASS; PDL on sm_90+ ----
    *(
        KernelSpec(
            f"sparse_attn.two_pass_scores{suffix}", f"{_OPS}.sparse_attn_two_pass:_scores_kernel",
            types=_SCORES_TYPES, aligned=_SCORES_ALIGNED,
            constexprs=dict(HAS_COUNTS=True, BLOCK_H=_TWO_PASS["BLOCK_H"], BLOCK_T=_TWO_PASS["BLOCK_T"],
                            BLOCK_K=_TWO_PASS["BLOCK_K"], PDL=pdl, TAIL_APART=True, WHOLE_TILE=False,
                            BLOCK_D=512, STORE_ROWS=False, **_NO_PK_LOAD),
            archs=archs, **_TWO_PASS["SCORES"],
            expect=Expect(kv_load_bytes=16, kv_lines=r"kv = tl\.load", max_regs=192, tensor_cores=True),
        )
        for suffix, pdl, archs in (("", False, (80,)), ("_pdl", True, (90, 100, 120)))
    ),
    *(
        KernelSpec(
            f"sparse_attn.two_pass_values{suffix}", f"{_OPS}.sparse_attn_two_pass:_values_kernel",
            types=_VALUES_TYPES, aligned=_VALUES_ALIGNED,
            constexprs=dict(HAS_COUNTS=True, BLOCK_H=_TWO_PASS["BLOCK_H"], BLOCK_T=_TWO_PASS["BLOCK_T"],
                            BLOCK_DV=_TWO_PASS["BLOCK_DV"], BLOCK_J=16, EVEN_D=True, PDL=pdl, PREFETCH=False,
                            TAIL_PROGRAMS=False, TOKEN_ROWS=False, KV_OPERAND=0, ROUNDS=False,
                            **_NO_PK_LOAD),
            archs=archs, **_TWO_PASS["VALUES"],
            # Triton 3.8's sm_100 build keeps one 8-byte value in local memory (2 STL/LDL); the
            # other versions and archs spill nothing.
            expect=Expect(kv_load_bytes=16, kv_lines=r"kv = tl\.load", max_regs=192, tensor_cores=True,
                          max_spill_ops=2),
        )
        for suffix, pdl, archs in (("", False, (80,)), ("_pdl", True, (90, 100, 120)))
    ),
    # ---- gated pool (ops/gated_pool_triton.py): fp32 compressor state -> bf16, B 1, D 512,
    # tiles from tile_config(B, R, D); the JIT specializes the unit stride along D ----
    KernelSpec(  # tile_config(1, 8, 512): [8, 8] tile on one warp -> 2 fp32 per thread
        "gated_pool.r8", f"{_OPS}.gated_pool_triton:_gated_pool_kernel",
        types=_GATED_POOL_TYPES, aligned=_GATED_POOL_ALIGNED,
        constexprs=dict(stride_kd=1, stride_sd=1, BLOCK_R=8, BLOCK_D=8), num_warps=1, num_stages=3,
        expect=Expect(kv_load_bytes=8, max_regs=64),
    ),
    KernelSpec(  # tile_config(1, 2, 512): V4.1 ratio 2, [2, 8] tile on one warp
        "gated_pool.r2", f"{_OPS}.gated_pool_triton:_gated_pool_kernel",
        types=_GATED_POOL_TYPES, aligned=_GATED_POOL_ALIGNED,
        constexprs=dict(stride_kd=1, stride_sd=1, BLOCK_R=2, BLOCK_D=8), num_warps=1, num_stages=3,
        expect=Expect(kv_load_bytes=4, max_regs=64),
    ),
    KernelSpec(  # tile_config(1, 128, 512): [128, 8] tile, 4 warps
        "gated_pool.r128", f"{_OPS}.gated_pool_triton:_gated_pool_kernel",
        types=_GATED_POOL_TYPES, aligned=(*_GATED_POOL_ALIGNED, "R"),
        constexprs=dict(stride_kd=1, stride_sd=1, BLOCK_R=128, BLOCK_D=8), num_warps=4, num_stages=3,
        expect=Expect(kv_load_bytes=16, max_regs=128),
    ),
    # ---- indexer scores (ops/indexer_triton.py), DeepSeek-V4: 64 index heads, head_dim 128,
    # bf16 key pool; PREFILL_CONFIG (4 queries x 64 heads per program) and DECODE_CONFIG of that
    # file. T and the strides over T are not multiples of 16 ----
    *(
        KernelSpec(
            f"indexer.scores{suffix}", f"{_OPS}.indexer_triton:_index_scores_kernel",
            types=INDEX_TYPES, aligned=INDEX_ALIGNED + ("stride_k",),
            constexprs=dict(PDL=False, BLOCK_Q=cfg["BLOCK_Q"], BLOCK_H=64, BLOCK_T=cfg["BLOCK_T"], BLOCK_D=128,
                            PACKED=False, PAIR_ORDER=False, ONE_BLOCK=cfg.get("BLOCKS_PER_SPLIT") == 1),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], archs=archs,
            expect=Expect(kv_load_bytes=16, kv_lines=r"k = tl\.load", tensor_cores=True, max_regs=regs),
        )
        # Registers: about 10% above the most measured under 3.6 / 3.8 / 3.9 (sm_90's 4-query tile:
        # 245 / 249 / 232, the hardware maximum is its bound with the no-spill check)
        for suffix, cfg, archs, regs in (
            ("", INDEX_PREFILL_CONFIG, (90,), 255),
            ("_q2", INDEX_PREFILL_CONFIG_Q2, (80, 100, 120), {80: 229, 100: 213, 120: 189}),
            ("_decode", INDEX_DECODE_CONFIG, None, {80: 140, 90: 69, 100: 79, 120: 143}),
        )
    ),
    # ---- ue8m0 round trips (ops/kv_quant_triton.py): bf16 rows, BLOCK_ROWS 16, 4 warps ----
    KernelSpec(  # V4 reference KV: fp8 e4m3, scale per 64 on the 448 non-rope channels of 512
        "kv_quant.fp8_b64", f"{_OPS}.kv_quant_triton:_ue8m0_round_trip_kernel",
        types=_KV_QUANT_TYPES, aligned=_KV_QUANT_ALIGNED,
        constexprs=dict(QMAX=448.0, FLOOR=1e-4, MANT_BITS=3, MIN_EXP=-6, BLOCK=64, BLOCK_ROWS=16),
        num_warps=4, num_stages=3, expect=Expect(kv_load_bytes=16, max_regs=128),
    ),
    KernelSpec(  # fp4 e2m1, scale per 32: [16, 32] bf16 tile -> 4 values (8 B) per thread
        "kv_quant.fp4_b32", f"{_OPS}.kv_quant_triton:_ue8m0_round_trip_kernel",
        types=_KV_QUANT_TYPES, aligned=_KV_QUANT_ALIGNED,
        constexprs=dict(QMAX=6.0, FLOOR=6.0 * 2.0**-126, MANT_BITS=1, MIN_EXP=0, BLOCK=32,
                        BLOCK_ROWS=16),
        num_warps=4, num_stages=3, expect=Expect(kv_load_bytes=8, max_regs=128),
    ),
    # ---- mHC coefficients (ops/hc_coefficients_triton.py): V4's 4 streams, 20 Sinkhorn rounds,
    # HC_CONFIG; no row gather, no dot ----
    KernelSpec(
        "mhc.coefficients", f"{_OPS}.hc_coefficients_triton:_hc_coefficients_kernel",
        types=dict(mix_ptr="*fp32", row_scale_ptr="*fp32", base_ptr="*fp32", scale_ptr="*fp32", pre_ptr="*fp32",
                   post_ptr="*fp32", comb_ptr="*fp32", T="i32", stride_m="i32"),
        aligned=("mix_ptr", "row_scale_ptr", "base_ptr", "scale_ptr", "pre_ptr", "post_ptr", "comb_ptr"),
        constexprs=dict(PDL=False, N=4, ITERS=20, EPS=1e-6, BLOCK_T=HC_CONFIG["BLOCK_T"]),
        num_warps=HC_CONFIG["num_warps"], num_stages=3,
        expect=Expect(max_regs=128),
    ),
    # ---- RMSNorm + RoPE (ops/norm_rope_triton.py): one program per row, warps from
    # norm_rope_warps(BLOCK_D); the rope pair partner is a second (narrow, cached) load ----
    KernelSpec(  # per-head q: weightless norm + rope, D 512, rope 64
        "norm_rope.q", f"{_OPS}.norm_rope_triton:_rms_norm_rope_kernel",
        types=_NORM_ROPE_TYPES, aligned=_NORM_ROPE_ALIGNED,
        constexprs=dict(PDL=False, NORM=True, HAS_WEIGHT=False, ROPE=True, INVERSE=False, BLOCK_D=512, **_NO_PK,
                        **_NO_HADAMARD), num_warps=2,
        num_stages=3, expect=Expect(max_regs=128),
    ),
    KernelSpec(  # a layer's input norm: weighted, D 4096 (Flash hidden size), no rope
        "norm_rope.hidden", f"{_OPS}.norm_rope_triton:_rms_norm_rope_kernel",
        types=_NORM_ROPE_TYPES, aligned=_NORM_ROPE_ALIGNED,
        constexprs=dict(PDL=False, NORM=True, HAS_WEIGHT=True, ROPE=False, INVERSE=False, BLOCK_D=4096, **_NO_PK,
                        **_NO_HADAMARD), num_warps=8,
        num_stages=3, expect=Expect(max_regs=128),
    ),
    # ---- compressor decode step (ops/compress_decode_triton.py): one program per sequence, 4 warps ----
    KernelSpec(  # CSA kv compressor: overlap, ratio 4, head_dim 512
        "compress_decode.csa", f"{_OPS}.compress_decode_triton:_compress_decode_kernel",
        types=_COMPRESS_DECODE_TYPES, aligned=_COMPRESS_DECODE_ALIGNED,
        constexprs=dict(PDL=False, RATIO=4, OVERLAP=True, BLOCK_R=4, BLOCK_D=512, **_NO_PK, **_NO_HADAMARD),
        num_warps=4, num_stages=3,
        expect=Expect(max_regs=168),
    ),
    KernelSpec(  # HCA: online softmax state, ratio 128, head_dim 512
        "compress_decode.hca", f"{_OPS}.compress_decode_triton:_compress_decode_kernel",
        types=_COMPRESS_DECODE_TYPES, aligned=_COMPRESS_DECODE_ALIGNED,
        constexprs=dict(PDL=False, RATIO=128, OVERLAP=False, BLOCK_R=1, BLOCK_D=512, **_NO_PK, **_NO_HADAMARD),
        num_warps=4, num_stages=3,
        expect=Expect(max_regs=128),
    ),
    # ---- MoE grouped matmul (ops/grouped_matmul_triton.py): bf16 activations and expert weights,
    # GROUPED_MATMUL_CONFIG; the gathered activation rows and the weight rows are 16-byte aligned ----
    KernelSpec(
        "moe.grouped_matmul", f"{_OPS}.grouped_matmul_triton:_grouped_matmul_kernel",
        types=dict(x_ptr="*bf16", w_ptr="*bf16", rows_ptr="*i64", ends_ptr="*i32", y_ptr="*bf16", N="i32", K="i32",
                   stride_x="i32", stride_we="i32", stride_wn="i32", stride_y="i32"),
        aligned=("x_ptr", "w_ptr", "rows_ptr", "ends_ptr", "y_ptr", "N", "K", "stride_x", "stride_we", "stride_wn",
                 "stride_y"),
        constexprs=dict(PDL=False, N_GROUPS=256, HAS_ROWS=True, BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, BLOCK_E=256), num_warps=4,
        num_stages=3,
        expect=Expect(kv_load_bytes=16, max_regs=200, tensor_cores=True),
    ),
    # ---- mHC mixer input, collapse, expand (ops/hc_mix_triton.py, hc_collapse_triton.py,
    # hc_expand_triton.py): V4-Flash, 4 streams of 4096, fn [24, 16384] fp32, bf16 streams ----
    # No tensor_cores for mhc.mix: its tl.dot is fp32 in IEEE precision (no TF32), which compiles to FFMA.
    KernelSpec(  # HC_MIX_CONFIGS["decode"], T = 1: 128 splits of two 64-wide K blocks, ticket merge; the
        # head's 4 mixes (BLOCK_M 16) with its pre epilogue, as the model runs it
        "mhc.mix_head_pre_decode", f"{_OPS}.hc_mix_triton:_hc_mix_kernel",
        types=_HC_MIX_TYPES, aligned=(*_HC_MIX_ALIGNED, "n_splits"),
        constexprs=dict(PDL=False, BLOCK_T=_MIX["decode"]["BLOCK_T"], BLOCK_M=16, BLOCK_K=_MIX["decode"]["BLOCK_K"],
                        BLOCK_S=128, SPLIT=True, **_HC_HEAD_PRE),
        num_warps=_MIX["decode"]["num_warps"], num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"x = tl\.load", max_regs=128),
    ),
    KernelSpec(  # HC_MIX_CONFIGS["prefill"], T = 2048: 64 token blocks x 2 splits
        "mhc.mix_prefill", f"{_OPS}.hc_mix_triton:_hc_mix_kernel",
        types=_HC_MIX_TYPES, aligned=_HC_MIX_ALIGNED,
        constexprs=dict(PDL=False, BLOCK_T=_MIX["prefill"]["BLOCK_T"], BLOCK_M=32, BLOCK_K=_MIX["prefill"]["BLOCK_K"],
                        BLOCK_S=2, SPLIT=True, **_NO_HC_COEFFS),
        num_warps=_MIX["prefill"]["num_warps"], num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"x = tl\.load", max_regs=128),
    ),
    KernelSpec(  # the decode mixer with the coefficients epilogue (the model's sublayers), T = 1: 2-token sub-block
        "mhc.mix_coefficients_decode", f"{_OPS}.hc_mix_triton:_hc_mix_kernel",
        types=_HC_MIX_TYPES, aligned=(*_HC_MIX_ALIGNED, "n_splits"),
        constexprs=dict(PDL=False, BLOCK_T=_MIX["decode"]["BLOCK_T"], BLOCK_M=32, BLOCK_K=_MIX["decode"]["BLOCK_K"],
                        BLOCK_S=128, SPLIT=True, COEFF_T=2, **_HC_COEFFS),
        num_warps=_MIX["decode"]["num_warps"], num_stages=3,
        # Triton 3.8 on sm_90 gives the 2-token epilogue 182 registers (3.6 / 3.9: <= 128); 2 warps, 128 programs.
        expect=Expect(kv_load_bytes=16, kv_lines=r"x = tl\.load", max_regs={80: 128, 90: 200, 100: 128, 120: 128}),
    ),
    KernelSpec(  # the prefill mixer with the coefficients epilogue, T = 2048
        "mhc.mix_coefficients_prefill", f"{_OPS}.hc_mix_triton:_hc_mix_kernel",
        types=_HC_MIX_TYPES, aligned=_HC_MIX_ALIGNED,
        constexprs=dict(PDL=False, BLOCK_T=_MIX["prefill"]["BLOCK_T"], BLOCK_M=32, BLOCK_K=_MIX["prefill"]["BLOCK_K"],
                        BLOCK_S=2, SPLIT=True, COEFF_T=16, **_HC_COEFFS),
        num_warps=_MIX["prefill"]["num_warps"], num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"x = tl\.load", max_regs=128),
    ),
    KernelSpec(  # HC_COLLAPSE_CONFIG
        "mhc.collapse", f"{_OPS}.hc_collapse_triton:_hc_collapse_kernel",
        types=dict(x_ptr="*bf16", pre_ptr="*fp32", y_ptr="*bf16", D="i32", stride_xt="i32", stride_xn="i32"),
        aligned=("x_ptr", "pre_ptr", "y_ptr", "D", "stride_xt", "stride_xn"),
        constexprs=dict(PDL=False, N=4, BLOCK_D=1024), num_warps=4, num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"x = tl\.load", max_regs=96),
    ),
    KernelSpec(  # HC_EXPAND_CONFIG
        "mhc.expand", f"{_OPS}.hc_expand_triton:_hc_expand_kernel",
        types=dict(f_ptr="*bf16", x_ptr="*bf16", post_ptr="*fp32", comb_ptr="*fp32", y_ptr="*bf16", D="i32",
                   stride_ft="i32", stride_xt="i32", stride_xn="i32"),
        aligned=("f_ptr", "x_ptr", "post_ptr", "comb_ptr", "y_ptr", "D", "stride_ft", "stride_xt", "stride_xn"),
        constexprs=dict(PDL=False, N=4, BLOCK_D=1024), num_warps=4, num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"x = tl\.load", max_regs=128),
    ),
    KernelSpec(  # the attention's expand fused with the ffn's mixer + coefficients (hc_expand_mix_triton.py), T = 1
        "mhc.expand_mix_decode", f"{_OPS}.hc_expand_mix_triton:_hc_expand_mix_kernel",
        types=dict(f_ptr="*bf16", x_ptr="*bf16", post_in_ptr="*fp32", comb_in_ptr="*fp32", y_ptr="*bf16",
                   **{k: v for k, v in _HC_MIX_TYPES.items() if k not in ("x_ptr", "K", "stride_x")},
                   D="i32", stride_ft="i32", stride_xt="i32", stride_xn="i32"),
        aligned=("f_ptr", "x_ptr", "post_in_ptr", "comb_in_ptr", "y_ptr", "D", "stride_ft", "stride_xt", "stride_xn",
                 *(a for a in _HC_MIX_ALIGNED if a not in ("x_ptr", "K", "stride_x")), "n_splits"),
        constexprs=dict(PDL=False, BLOCK_T=_MIX["decode"]["BLOCK_T"], BLOCK_M=32, BLOCK_K=_MIX["decode"]["BLOCK_K"],
                        BLOCK_S=128, SPLIT=True, N=4, ITERS=20, HC_EPS=1e-6, COEFF_T=2),
        num_warps=_MIX["decode"]["num_warps"], num_stages=3,
        # Triton 3.6 on sm_80 spills 8 B (4 STL/LDL) at 128 registers, 3.8 / 3.9 there take 158 and none;
        # sm_90 / 100 / 120 112-128 with every version.
        expect=Expect(kv_load_bytes=16, kv_lines=r"x = tl\.load", max_regs={80: 176, 90: 140, 100: 140, 120: 140},
                      max_spill_ops=4),
    ),
    # ---- MoE routing, pick sort, clamped SwiGLU, combine (ops/moe_*_triton.py, swiglu_triton.py):
    # V4-Flash, 256 experts, top-6, hidden 4096, intermediate 2048, bf16 ----
    *(
        KernelSpec(  # MOE_ROUTE_CONFIG, sqrtsoftplus; score layers (biased top-k) and hash layers
            f"moe.route_{kind}", f"{_OPS}.moe_route_triton:_moe_route_kernel",
            types=dict(logit_ptr="*bf16", bias_ptr="*fp32", tid2eid_ptr="*i64", token_ptr="*i64", rows_ptr="*i64",
                       experts_ptr="*i64", weights_ptr="*fp32", T="i32", E="i32", stride_l="i32", scaling="fp32"),
            aligned=("logit_ptr", "bias_ptr", "tid2eid_ptr", "token_ptr", "rows_ptr", "experts_ptr", "weights_ptr",
                     "E", "stride_l"),
            constexprs=dict(PDL=False, TOP_K=6, SCORING=0, NORMALIZE=True, HASHED=kind == "hash", HAS_ROWS=True,
                            BLOCK_T=4, BLOCK_E=256, BLOCK_K=8),
            num_warps=4, num_stages=3, expect=Expect(max_regs=128),
        )
        for kind in ("score", "hash")
    ),
    KernelSpec(  # MOE_SORT_CONFIG
        "moe.sort", f"{_OPS}.moe_sort_triton:_moe_sort_kernel",
        types=dict(experts_ptr="*i64", rows_ptr="*i64", ends_ptr="*i32", pos_ptr="*i64", P="i32", E="i32"),
        aligned=("experts_ptr", "rows_ptr", "ends_ptr", "pos_ptr", "E"),
        constexprs=dict(PDL=False, TOP_K=6, BLOCK_P=64, BLOCK_E=64, BLOCK_Q=32), num_warps=4, num_stages=3,
        expect=Expect(max_regs=128),
    ),
    KernelSpec(  # SWIGLU_CONFIG; gate and up are the two halves of the grouped matmul's [M, 4096]
        "moe.clamped_swiglu", f"{_OPS}.swiglu_triton:_clamped_swiglu_kernel",
        types=dict(gate_ptr="*bf16", up_ptr="*bf16", h_ptr="*bf16", I="i32", stride_g="i32", stride_u="i32",
                   limit="fp32"),
        aligned=("gate_ptr", "up_ptr", "h_ptr", "I", "stride_g", "stride_u"),
        constexprs=dict(PDL=False, BLOCK_I=1024), num_warps=4, num_stages=3,
        expect=Expect(kv_load_bytes=16, max_regs=96),
    ),
    KernelSpec(  # MOE_COMBINE_CONFIG, with the shared expert's output added
        "moe.combine", f"{_OPS}.moe_combine_triton:_moe_combine_kernel",
        types=dict(y_ptr="*bf16", pos_ptr="*i64", w_ptr="*fp32", add_ptr="*bf16", out_ptr="*bf16", D="i32",
                   stride_y="i32", stride_a="i32"),
        aligned=("y_ptr", "pos_ptr", "w_ptr", "add_ptr", "out_ptr", "D", "stride_y", "stride_a"),
        constexprs=dict(PDL=False, K=6, HAS_ADD=True, BLOCK_D=512, HAS_POS=True), num_warps=2, num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"acc \+= w \* tl\.load", max_regs=96),
    ),
    # ---- quantized weights (ops/fp8_linear_triton.py, mxfp4_grouped_matmul_triton.py): V4-Flash shapes,
    # bf16 activations. FP8 operands need sm_89+: sm_80 gets the same kernels with NATIVE_FP8=False and
    # FP8_DOT=False, which read the e4m3 bytes as uint8, decode them with integer ops and run bf16 dots
    # (exact: e4m3 values are exact in bf16). Decode: M = 8 rows, wq_a [1024, 4096], split-K over the
    # 16 N tiles (out = the fp32 partials); prefill: 128x128 tiles, y in bf16 (FP8_PREFILL_CONFIG for
    # w8a8 with fp8 dots, FP8_PREFILL_DEQUANT_CONFIG for weight-only and for sm_80). ----
    *(
        KernelSpec(  # ACT_QUANT_CONFIG: V4 (per 128 channels) and V4.1 (per 32)
            f"quant.act_quant_b{group}", f"{_OPS}.fp8_act_quant_triton:_act_quant_kernel",
            types=dict(x_ptr="*bf16", q_ptr="*u8", s_ptr="*fp32", K="i32", stride_x="i32", stride_q="i32",
                       stride_s="i32"),
            aligned=("x_ptr", "q_ptr", "s_ptr", "K", "stride_x", "stride_q"),
            constexprs=dict(GROUP=group, BLOCK_G=1024, PDL=False), num_warps=4, num_stages=3,
            expect=Expect(kv_load_bytes=16, kv_lines=r"x = tl\.load", max_regs=40),
        )
        for group in (128, 32)
    ),
    *(
        KernelSpec(  # FP8_DECODE_CONFIG (16 rows; 64 rows: BLOCK_M 64) / FP8_PREFILL_CONFIG, V4 128x128 blocks
            f"fp8_linear.{phase}{'_m64' if m64 else ''}_{mode}{'_sm80' if sm80 else ''}",
            f"{_OPS}.fp8_linear_triton:_fp8_linear_{phase}_kernel",
            types=dict(
                x_ptr=("*u8" if sm80 else "*fp8e4nv") if mode == "w8a8" else "*bf16",
                xs_ptr="*fp32", w_ptr="*u8" if sm80 else "*fp8e4nv", ws_ptr="*fp32",
                **(dict(part_ptr="*fp32", y_ptr="*bf16", arrivals_ptr="*i32") if phase == "decode"
                   else dict(y_ptr="*bf16")),
                M="i32", N="i32", K="i32", **(dict(k_per_split="i32", limit="fp32") if phase == "decode" else {}),
                stride_x="i32", stride_xs="i32", stride_w="i32", stride_ws="i32", stride_y="i32"),
            aligned=("x_ptr", "xs_ptr", "w_ptr", "ws_ptr", "y_ptr", "N", "K", "stride_x", "stride_w", "stride_y",
                     *(("part_ptr", "arrivals_ptr", "k_per_split") if phase == "decode" else ())),
            constexprs=dict(PDL=False, BN=128, BK=128, AB=128 if mode == "w8a8" else 1, ACT_FP8=mode == "w8a8",
                            FP8_DOT=mode == "w8a8" and not sm80, NATIVE_FP8=not sm80, POST_SCALE=True, IEEE=False,
                            # decode: 16 splits; the weight-only 16-row one sums them in its last program
                            # (SUM_LAST: W8A16_DECODE_RULE up to 16 rows; 64 rows keep the sum kernel)
                            **(dict(SPLITS=16, SUM_LAST=mode == "w8a16" and not m64, SWIGLU=False)
                               if phase == "decode" else {}),
                            **{k: v for k, v in cfg.items() if k.startswith("BLOCK")}),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
            archs=(80,) if sm80 else (90, 100, 120),
            expect=Expect(kv_load_bytes=16, kv_lines=r"(?<!_)w = tl\.load", tensor_cores=True,
                          max_regs=_QUANT_MAX_REGS[f"{phase}{'_m64' if m64 else ''}_{mode}{'_sm80' if sm80 else ''}"]),
        )
        for phase in ("decode", "prefill") for m64 in ((False, True) if phase == "decode" else (False,))
        for mode in ("w8a16", "w8a8") for sm80 in ((False,) if m64 else (False, True))
        for cfg in [dict(_FP8_DECODE, BLOCK_M=64 if m64 else _FP8_DECODE["BLOCK_M"]) if phase == "decode"
                    else _FP8_PREFILL_DEQUANT if mode == "w8a16" else _FP8_PREFILL_SM80 if sm80 else _FP8_PREFILL]
    ),
    KernelSpec(  # SPLIT_K_SUM_BLOCK; wq_a decode at 17 splits
        "fp8_linear.split_k_sum", f"{_OPS}.fp8_linear_decode_triton:_split_k_sum_kernel",
        types=dict(part_ptr="*fp32", y_ptr="*bf16", MN="i32"), aligned=("part_ptr", "y_ptr", "MN"),
        constexprs=dict(PDL=False, TRIGGER=False, SPLIT_K=17, BLOCK=1024), num_warps=4, num_stages=3,
        expect=Expect(kv_load_bytes=16, max_regs=64),
    ),
    *(
        KernelSpec(  # MXFP4_*_CONFIG: fused gate_up [256, 4096, 4096 / 2] with the SwiGLU epilogue, down
            # [256, 4096, 2048 / 2]; scales read as int32 words (SCALE_WORDS: K % 128 == 0, as in every
            # checkpoint); weights decoded by the PTX block (production on CUDA) or by integer ops (bits)
            f"moe.mxfp4_grouped_matmul_{phase}_{proj}_{decode}",
            f"{_OPS}.mxfp4_grouped_matmul_triton:_mxfp4_grouped_matmul_kernel",
            types=dict(x_ptr="*bf16", w_ptr="*u8", s_ptr="*u8", rows_ptr="*i64", ends_ptr="*i32", y_ptr="*bf16",
                       N="i32", K="i32", K_BYTES="i32", K_SCALES="i32", stride_x="i32", stride_we="i32",
                       stride_wn="i32", stride_se="i32", stride_sn="i32", stride_y="i32", limit="fp32"),
            aligned=("x_ptr", "w_ptr", "s_ptr", "rows_ptr", "ends_ptr", "y_ptr", "N", "K", "K_BYTES", "K_SCALES",
                     "stride_x", "stride_we", "stride_wn", "stride_se", "stride_sn", "stride_y"),
            constexprs=dict(PDL=False, N_GROUPS=256, HAS_ROWS=proj == "gate_up", IEEE=False, SCALE_WORDS=True,
                            DECODE_ASM=decode == "asm", SWIGLU=proj == "gate_up", BLOCK_E=256,
                            W_AS_A=cfg.get("W_AS_A", False), **{k: v for k, v in cfg.items() if k.startswith("BLOCK")}),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
            expect=Expect(kv_load_bytes=16, kv_lines=r"packed = tl\.load", tensor_cores=True,
                          max_regs=_QUANT_MAX_REGS[f"mxfp4_{phase}"]),
        )
        for phase, proj, decode, cfg in (
            ("decode", "gate_up", "asm", _MXFP4_DECODE_SWIGLU), ("decode", "down", "asm", _MXFP4_DECODE),
            ("decode", "gate_up", "bits", _MXFP4_DECODE_SWIGLU), ("decode", "down", "bits", _MXFP4_DECODE),
            ("prefill", "gate_up", "asm", _MXFP4_PREFILL_SWIGLU), ("prefill", "down", "asm", _MXFP4_PREFILL))
    ),
    # ---- offloaded experts (ops/expert_cache_plan_triton.py, ops/expert_fetch_triton.py): V4-Flash,
    # 256 experts, 12 slots; the fetch copies rows of int32 words (an expert's gate_up: 2,097,152) ----
    KernelSpec(  # PLAN_CONFIG
        "offload.expert_cache_plan", f"{_OPS}.expert_cache_plan_triton:_expert_cache_plan_kernel",
        types=dict(picks_ptr="*i64", host_row_ptr="*i64", index_ptr="*i64", slot_expert_ptr="*i64",
                   slot_stamp_ptr="*i64", clock_ptr="*i64", fetches_ptr="*i64", counts_ptr="*i64", scratch_ptr="*i32",
                   copy_count_ptr="*i64", copy_slot_ptr="*i64", copy_src_ptr="*i64", mapped_ptr="*i64",
                   resident_ptr="*i64", N="i32", E="i32", S="i32", chunk="i32", n_resident="i32"),
        aligned=("picks_ptr", "host_row_ptr", "index_ptr", "slot_expert_ptr", "slot_stamp_ptr", "clock_ptr",
                 "fetches_ptr", "counts_ptr", "scratch_ptr", "copy_count_ptr", "copy_slot_ptr", "copy_src_ptr",
                 "mapped_ptr", "resident_ptr", "E"),
        constexprs=dict(COUNT=True, WITH_RESIDENT=False, RESIDENT_OUT=True, BLOCK_E=256, BLOCK_S=16, BLOCK_N=1024), num_warps=4,
        num_stages=3, expect=Expect(max_regs=128),
    ),
    KernelSpec(  # FETCH_CONFIG
        "offload.expert_fetch", f"{_OPS}.expert_fetch_triton:_expert_fetch_kernel",
        types=dict(src_ptr="*i32", dst_ptr="*i32", copy_count_ptr="*i64", copy_slot_ptr="*i64", copy_src_ptr="*i64",
                   row_words="i32", dst_row0="i32", n_chunks="i32"),
        aligned=("src_ptr", "dst_ptr", "copy_count_ptr", "copy_slot_ptr", "copy_src_ptr", "row_words"),
        constexprs=dict(BLOCK=2048), num_warps=4, num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=r"values = tl\.load", max_regs=64),
    ),
    # ---- packed KV rows (issue 17): v4serve/codegen/registry_packed_kv.py ----
    *PACKED_KV_KERNELS,
    *KV_COMPACT_KERNELS,
    # ---- MXFP4 MoE GEMV for few picks an expert: v4serve/codegen/registry_mxfp4_gemv.py ----
    *MXFP4_GEMV_KERNELS,
    *MXFP4_MOE_DECODE_KERNELS,
    *MXFP4_MOE_MMA_KERNELS,
    *DECODE_FUSION_KERNELS,
    *LAUNCH_GLUE_KERNELS,
    *SPEC_VERIFY_KERNELS,  # the verify step's compressor steps and state commit
    *INDEX_TOPK_KERNELS,  # the indexer's top-k without torch.sort (registry_index_topk.py)
    # ---- FP8 linear, weights-first decode kernel: v4serve/codegen/registry_fp8_decode.py ----
    *FP8_DECODE_KERNELS,
    # ---- FP8 linear at 17..32 rows, weight-only (verify batches): registry_fp8_rows32.py ----
    *FP8_ROWS32_KERNELS,
    # ---- FP8 gate | up with the shared expert's SwiGLU in the epilogue: registry_fp8_swiglu.py ----
    *FP8_SWIGLU_KERNELS,
    # ---- DeepSeek-V4.1 indexer over packed fp4 keys: v4serve/codegen/registry_v41_index.py ----
    *V41_INDEX_KERNELS,
    # ---- DeepSeek-V4.1 engine path: two-format attention unpack, Engram lookup (registry_v41_engine.py) ----
    *V41_ENGINE_KERNELS,
    # ---- sampler: the structured-output token bitmask on fp32 logits (ops/token_bitmask_triton.py) ----
    KernelSpec(  # TOKEN_BITMASK_CONFIG
        "sampler.token_bitmask", f"{_OPS}.token_bitmask_triton:_token_bitmask_kernel",
        types=dict(logits_ptr="*fp32", mask_ptr="*i32", V="i32", stride_l="i32", stride_m="i32"),
        aligned=("logits_ptr", "mask_ptr", "V", "stride_l", "stride_m"),
        constexprs=dict(BLOCK_V=2048), num_warps=4, num_stages=3, expect=Expect(max_regs=64),
    ),
)


def by_name() -> dict[str, KernelSpec]:
    names = [k.name for k in KERNELS]
    dupes = {n for n in names if names.count(n) > 1}
    if dupes:
        raise ValueError(f"duplicate registry names: {sorted(dupes)}")
    return {k.name: k for k in KERNELS}
