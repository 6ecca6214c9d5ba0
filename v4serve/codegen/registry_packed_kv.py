"""Codegen registry entries of the kernels over packed KV rows (issue 17; v4serve/ops/kv_pack*.py),
kept in their own file so that merges with other registry edits stay trivial. registry.py appends
PACKED_KV_KERNELS to KERNELS.

Shapes: DeepSeek-V4 main / window rows fp8_e8m0_b64_rope64 at D 512 (592-byte rows: 448 e4m3
codes, 64 bf16 rope channels, 7 ue8m0 scales, padding), indexer keys fp4_e8m0_b32 at Dk 128
(68-byte rows read as 17 int32 words). Expectations: the code and tail gathers of `load_packed`
stay 16-byte loads, the scale words 4-byte loads (no load narrower than 4 bytes anywhere), the
indexer's key words 4-byte loads; no spills. Register bounds are not set yet (no measurement):
255, the hardware's maximum.
"""
from v4serve.formats import row_format
from v4serve.ops.indexer_triton import DECODE_CONFIG as INDEX_DECODE_CONFIG
from v4serve.ops.indexer_triton import PREFILL_CONFIG as INDEX_PREFILL_CONFIG
from v4serve.ops.indexer_triton import PREFILL_CONFIG_Q2 as INDEX_PREFILL_CONFIG_Q2
from v4serve.ops.kv_pack_triton import packed_constexprs, store_warps
from v4serve.ops.sparse_attn_values_gluon import MAX_REGS as VALUES_GLUON_MAX_REGS
from v4serve.ops.sparse_attn_triton import (
    DECODE_CONFIG_SMALL_PACKED, DECODE_CONFIG_TWO_PASS, DECODE_CONFIG_TWO_PASS_PACKED, PREFILL_CONFIGS_PACKED)

from .spec import Expect, KernelSpec

_OPS = "v4serve.ops"
_FP8 = packed_constexprs(row_format("fp8_e8m0_b64_rope64"), 512)
_FP4 = packed_constexprs(row_format("fp4_e8m0_b32"), 128)
_LOAD_PK = {k: _FP8[k] for k in ("PK_NQ", "PK_BLOCK", "PK_TAIL_OFF", "PK_SCALE_OFF", "PK_HAS_TAIL")}
_GATHER_LINES = r"codes = tl\.load|tail = tl\.load"
_STRIDES = ("stride_qt", "stride_qh", "stride_pool", "stride_it", "stride_ot", "stride_oh", "stride_pt", "stride_ps",
            "stride_ph", "stride_mt", "stride_ms")
# The indexer-scores kernel's arguments (ops/indexer_triton.py; the bf16-key entries are
# in registry.py): what the JIT marks 16-divisible at the production launch.
INDEX_TYPES = dict(
    q_ptr="*bf16", w_ptr="*fp32", k_ptr="*bf16", rows_ptr="*i32", n_visible_ptr="*i32", out_ptr="*fp32", S="i32",
    H="i32", Dk="i32", T="i32", blocks_per_split="i32", w_scale="fp32", **dict.fromkeys(
        ("stride_qb", "stride_qs", "stride_qh", "stride_wb", "stride_ws", "stride_k", "stride_rb", "stride_nb",
         "stride_ob", "stride_os"), "i32"))
INDEX_ALIGNED = ("q_ptr", "w_ptr", "k_ptr", "rows_ptr", "n_visible_ptr", "out_ptr", "H", "Dk", "stride_qb",
                  "stride_qs", "stride_qh", "stride_wb", "stride_ws")


def unpack_columns_spec(name: str, window_format: str, compressed_format: str) -> KernelSpec:
    """The per-column unpack (ops/sparse_attn_unpacked_decode.py) over pools of these row formats at D 512."""
    from v4serve.ops.kv_compact_triton import pool_constexprs

    formats = {**pool_constexprs("W_", row_format(window_format), 512),
               **pool_constexprs("C_", row_format(compressed_format), 512)}
    return KernelSpec(
        name, f"{_OPS}.sparse_attn_unpacked_decode:_unpack_columns_kernel",
        types=dict(win_ptr="*u8", cmp_ptr="*u8", idx_ptr="*i32", counts_ptr="*i32", rows_ptr="*bf16",
                   cols_ptr="*i32", C="i32", D="i32", n_window="i32", stride_win="i32", stride_cmp="i32",
                   stride_it="i32", stride_rows="i32", stride_ct="i32"),
        aligned=("win_ptr", "cmp_ptr", "idx_ptr", "counts_ptr", "rows_ptr", "cols_ptr", "C", "D", "n_window",
                 "stride_win", "stride_cmp", "stride_it", "stride_rows", "stride_ct"),
        constexprs=dict(HAS_COUNTS=True, BLOCK_C=16, BLOCK_D=512, FP8_CVT=True, **formats), num_warps=4,
        archs=(90, 100, 120),
        expect=Expect(kv_load_bytes=16, kv_lines=_GATHER_LINES + r"|code_words = tl\.load"),
    )


_ATTN_TYPES = dict(
    q_ptr="*bf16", win_ptr="*u8", cmp_ptr="*u8", idx_ptr="*i32", counts_ptr="*i32", sink_ptr="*fp32",
    out_ptr="*bf16", ticket_ptr="*i32", H="i32", D="i32", C="i32", n_window="i32", cols_per_split="i32",
    wide_from="i32", wide_cols_per_split="i32", n_splits="i32", qk_scale_log2="fp32", **dict.fromkeys(_STRIDES, "i32"))
# stride_pool 592 is a multiple of 16; the rest as in registry.py's sparse-attention entries.
_ATTN_ALIGNED = ("q_ptr", "win_ptr", "cmp_ptr", "idx_ptr", "counts_ptr", "sink_ptr", "out_ptr", "part_ptr", "m_ptr",
                 "l_ptr", "ticket_ptr", "H", "D", "C", "n_window", "cols_per_split", "wide_from", "wide_cols_per_split",
                 *_STRIDES)
_TP = DECODE_CONFIG_TWO_PASS
_TPP = DECODE_CONFIG_TWO_PASS_PACKED
_DEC = DECODE_CONFIG_SMALL_PACKED
# The hardware e4m3 conversion (load_packed's FP8_CVT) where production uses it: sm_89 and newer.
_CVT = {arch: arch >= 89 for arch in (80, 90, 100, 120)}


def compress_decode_types(pool_ptr: str, **extra: str) -> dict[str, str]:
    """Argument types of the compressor's decode kernel (compress_decode_triton) and of the verify
    kernel built on its body (`extra`: its own arguments). pool_ptr: "*u8" for packed rows, "*bf16"
    when the kernel stores bf16 rows (then pool_ptr is the rows again)."""
    return dict(kv_ptr="*fp32", score_ptr="*fp32", pos_ptr="*i64", slot_ptr="*i64", bias_ptr="*fp32",
                s0_ptr="*fp32", s1_ptr="*fp32", s2_ptr="*fp32", w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32",
                rows_of_ptr="*i32", rows_ptr="*bf16", target_ptr="*i64", pool_ptr=pool_ptr, d="i32", R="i32",
                scratch="i32", eps="fp32", stride_in="i32", stride_slot="i32", stride_rows_of="i32", stride_cs="i32",
                stride_pool="i32", **extra)


# stride_pool is left out: 68-byte fp4 rows are not 16-byte multiples (the callers add it where it is).
COMPRESS_DECODE_ALIGNED = ("kv_ptr", "score_ptr", "pos_ptr", "slot_ptr", "bias_ptr", "s0_ptr", "s1_ptr", "s2_ptr",
                           "w_ptr", "cos_ptr", "sin_ptr", "rows_of_ptr", "rows_ptr", "target_ptr", "pool_ptr", "d",
                           "stride_in", "stride_slot")
_TP_STRIDES = ("stride_pool", "stride_it", "stride_pt", "stride_ph", "stride_mt", "stride_mj")
_SCORES_TYPES = dict(
    q_ptr="*bf16", win_ptr="*u8", cmp_ptr="*u8", idx_ptr="*i32", counts_ptr="*i32", sink_ptr="*fp32",
    p_ptr="*bf16", m_ptr="*fp32", l_ptr="*fp32", rows_ptr="*bf16", H="i32", D="i32", C="i32", n_window="i32",
    qk_scale_log2="fp32", **dict.fromkeys(("stride_qt", "stride_qh", *_TP_STRIDES, "stride_rt"), "i32"))
_VALUES_TYPES = dict(
    win_ptr="*u8", cmp_ptr="*u8", idx_ptr="*i32", counts_ptr="*i32", sink_ptr="*fp32", p_ptr="*bf16",
    m_ptr="*fp32", l_ptr="*fp32", out_ptr="*bf16", H="i32", D="i32", C="i32", n_window="i32",
    **dict.fromkeys((*_TP_STRIDES, "stride_ot", "stride_oh", "stride_rt"), "i32"))

PACKED_KV_KERNELS: tuple[KernelSpec, ...] = (
    # ---- sparse attention over packed rows: prefill (the tl kernel: packed prefill never takes the
    # Gluon kernel), split-K decode, two-pass decode ----
    *(
        KernelSpec(  # PREFILL_CONFIGS_PACKED[arch]: the sliced kernel (QK_SLICE), 32 heads or fewer
            f"sparse_attn.prefill_fp8kv_sm{arch}", f"{_OPS}.sparse_attn_triton:_sparse_attn_sliced_kernel",
            types=dict(_ATTN_TYPES, part_ptr="*bf16", m_ptr="*bf16", l_ptr="*bf16", ticket_ptr="*bf16"),
            aligned=_ATTN_ALIGNED,
            constexprs=dict(n_splits=1, HAS_COUNTS=False, SPLIT=False, FUSED_MERGE=False, BLOCK_H=cfg["BLOCK_H"],
                            BLOCK_T=cfg["BLOCK_T"], BLOCK_D=512, PDL=False, EVEN_D=True, PACKED=True,
                            QK_SLICE=cfg["QK_SLICE"], PK_FP8_CVT=_CVT[arch], **_FP8),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], archs=(arch,),
            expect=Expect(kv_load_bytes=16, kv_lines=_GATHER_LINES, tensor_cores=True),
        )
        for arch, cfg in PREFILL_CONFIGS_PACKED.items()
    ),
    KernelSpec(  # DECODE_CONFIG_SMALL_PACKED, the whole tile dequantized once (LARGE differs only in
        # COLS_PER_SPLIT, a runtime argument)
        "sparse_attn.decode_fp8kv_pdl", f"{_OPS}.sparse_attn_triton:_sparse_attn_kernel",
        types=dict(_ATTN_TYPES, part_ptr="*fp32", m_ptr="*fp32", l_ptr="*fp32"), aligned=_ATTN_ALIGNED,
        constexprs=dict(HAS_COUNTS=True, SPLIT=True, FUSED_MERGE=False, BLOCK_H=_DEC["BLOCK_H"],
                        BLOCK_T=_DEC["BLOCK_T"], BLOCK_D=512, PDL=True, EVEN_D=True, PACKED=True, PK_FP8_CVT=True,
                        PK_BF16_OPERAND=True,
                        **_FP8),
        num_warps=_DEC["num_warps"], num_stages=_DEC["num_stages"],
        archs=(90, 100, 120),
        expect=Expect(kv_load_bytes=16, kv_lines=_GATHER_LINES, tensor_cores=True),
    ),
    *(
        KernelSpec(  # sm_90 / sm_100: DECODE_CONFIG_TWO_PASS_PACKED, the whole tile at once (WHOLE_TILE ignores
            # TAIL_APART; the launcher passes two_pass_tail_apart: True there); sm_120: the K loop of
            # DECODE_CONFIG_TWO_PASS (the whole tile needs 128 KB of shared memory), TAIL_APART False
            f"sparse_attn.two_pass_scores_fp8kv_pdl{suffix}", f"{_OPS}.sparse_attn_two_pass:_scores_kernel",
            types=_SCORES_TYPES, aligned=tuple(k for k in _SCORES_TYPES if k != "qk_scale_log2"),
            constexprs=dict(HAS_COUNTS=True, BLOCK_H=cfg["BLOCK_H"], BLOCK_T=cfg["BLOCK_T"],
                            BLOCK_K=cfg["BLOCK_K"], PDL=True, PACKED=True, PK_FP8_CVT=True, TAIL_APART=tail_apart,
                            WHOLE_TILE=cfg.get("WHOLE_TILE", False), BLOCK_D=512, STORE_ROWS=False,
                            **_LOAD_PK),
            archs=archs, **cfg["SCORES"],
            expect=Expect(kv_load_bytes=16, kv_lines=_GATHER_LINES, tensor_cores=True),
        )
        for suffix, archs, tail_apart, cfg in (("", (90, 100), True, _TPP), ("_sm120", (120,), False, _TP))
    ),
    # UNPACKED_ROWS (sm_90 / sm_100, WHOLE_TILE): the scores pass also stores its dequantized tile as
    # bf16 rows (16-byte stores), and the values pass reads those rows in column order (the bf16
    # loop: 16-byte cp.async, no dequantization)
    KernelSpec(
        "sparse_attn.two_pass_scores_fp8kv_rows_pdl", f"{_OPS}.sparse_attn_two_pass:_scores_kernel",
        types=_SCORES_TYPES, aligned=tuple(k for k in _SCORES_TYPES if k != "qk_scale_log2"),
        constexprs=dict(HAS_COUNTS=True, BLOCK_H=_TPP["BLOCK_H"], BLOCK_T=_TPP["BLOCK_T"], BLOCK_K=_TPP["BLOCK_K"],
                        PDL=True, PACKED=True, PK_FP8_CVT=True, TAIL_APART=True, WHOLE_TILE=True, BLOCK_D=512,
                        STORE_ROWS=True, **_LOAD_PK),
        archs=(90, 100), **_TPP["SCORES"],
        expect=Expect(kv_load_bytes=16, kv_lines=_GATHER_LINES, tensor_cores=True),
    ),
    KernelSpec(
        "sparse_attn.two_pass_values_rows_pdl", f"{_OPS}.sparse_attn_two_pass:_values_kernel",
        types=dict(_VALUES_TYPES, win_ptr="*bf16", cmp_ptr="*bf16"), aligned=tuple(_VALUES_TYPES),
        constexprs=dict(HAS_COUNTS=True, BLOCK_H=_TP["BLOCK_H"], BLOCK_T=_TP["BLOCK_T"], BLOCK_DV=_TP["BLOCK_DV"],
                        BLOCK_J=16, EVEN_D=True, PDL=True, PREFETCH=False, TAIL_PROGRAMS=False, TOKEN_ROWS=True,
                        ROUNDS=False, KV_OPERAND=0, PACKED=False, PK_NQ=0, PK_BLOCK=1, PK_TAIL_OFF=0, PK_SCALE_OFF=0,
                        PK_HAS_TAIL=False, PK_FP8_CVT=False),  # the launch's defaults: the rows are bf16
        archs=(90, 100), **_TP["VALUES"],
        expect=Expect(kv_load_bytes=16, kv_lines=r"kv = tl\.load", tensor_cores=True),
    ),
    # The production values pass over packed rows, then issue 17's B8 sweep variants (sm_90 / sm_100;
    # kernel_configs 'fp8kv'): values programs of 32 heads
    # (mma.sync, the tile through the bf16 operand boundary: no async-proxy fence a tile); the tile as the
    # left operand of the transposed dot (wgmma reads it from registers), 64 dims for 32 or 64 heads a
    # program; the whole-tile scores pass over one warpgroup (4 warps: m64n64 wgmma steps, Q read once
    # a step instead of once per warpgroup)
    *(
        KernelSpec(
            f"sparse_attn.two_pass_values_fp8kv{suffix}_pdl", f"{_OPS}.sparse_attn_two_pass:_values_kernel",
            types=_VALUES_TYPES, aligned=tuple(_VALUES_TYPES),
            constexprs=dict(HAS_COUNTS=True, BLOCK_H=block_h, BLOCK_T=_TP["BLOCK_T"], BLOCK_DV=block_dv,
                            BLOCK_J=16, EVEN_D=True, PDL=True, PACKED=True, PK_FP8_CVT=True, PREFETCH=False,
                            TAIL_PROGRAMS=False, TOKEN_ROWS=False, KV_OPERAND=kv_operand, ROUNDS=rounds,
                            **_LOAD_PK),
            archs=archs, **_TP["VALUES"],
            expect=Expect(kv_load_bytes=16, kv_lines=_GATHER_LINES, tensor_cores=True),
        )
        # kv_lhs_h64 on sm_90 only: Triton 3.9 spills it on sm_100 (255 registers), where wgmma's
        # register operand, the point of the variant, does not exist
        # _rounds: production's tiles over a wide cache (more than BLOCK_J tiles: the prologue in rounds)
        for suffix, block_h, block_dv, kv_operand, rounds, archs in (
            ("", _TP["BLOCK_H"], _TP["BLOCK_DV"], 0, False, (90, 100, 120)),
            ("_rounds", _TP["BLOCK_H"], _TP["BLOCK_DV"], 0, True, (90, 100, 120)),
            ("_h32_mma", 32, 32, 1, False, (90, 100)),
            ("_kv_lhs", 32, 64, 2, False, (90, 100)),
            ("_kv_lhs_h64", 64, 64, 2, False, (90,)))
    ),
    KernelSpec(
        "sparse_attn.two_pass_scores_fp8kv_4w_pdl", f"{_OPS}.sparse_attn_two_pass:_scores_kernel",
        types=_SCORES_TYPES, aligned=tuple(k for k in _SCORES_TYPES if k != "qk_scale_log2"),
        constexprs=dict(HAS_COUNTS=True, BLOCK_H=_TPP["BLOCK_H"], BLOCK_T=_TPP["BLOCK_T"], BLOCK_K=_TPP["BLOCK_K"],
                        PDL=True, PACKED=True, PK_FP8_CVT=True, TAIL_APART=True, WHOLE_TILE=True, BLOCK_D=512,
                        STORE_ROWS=False, **_LOAD_PK),
        archs=(90, 100), num_warps=4, num_stages=1,
        expect=Expect(kv_load_bytes=16, kv_lines=_GATHER_LINES, tensor_cores=True),
    ),
    # each token's columns unpacked, then the bf16 launch: V4's comparison route KERNEL="unpack" (fp8kv),
    # V4.1's production decode over its two formats (v41kv; its entries: registry_v41_engine.py)
    unpack_columns_spec("sparse_attn.unpack_columns_fp8kv", "fp8_e8m0_b64_rope64", "fp8_e8m0_b64_rope64"),
    # ---- indexer scores over packed fp4 keys: 17-word rows, 4-byte aligned only (stride_k 17 words);
    # prefill and decode tiles, and the decode-first variant's key decoder ----
    *(
        KernelSpec(
            f"indexer.scores{suffix}_fp8kv", f"{_OPS}.indexer_triton:_index_scores_kernel",
            types=dict(INDEX_TYPES, k_ptr="*i32"), aligned=INDEX_ALIGNED,
            constexprs=dict(PDL=False, BLOCK_Q=cfg["BLOCK_Q"], BLOCK_H=64, BLOCK_T=cfg["BLOCK_T"], BLOCK_D=128,
                            PACKED=True, PAIR_ORDER=False, ONE_BLOCK=cfg.get("BLOCKS_PER_SPLIT") == 1),
            num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], archs=archs,
            expect=Expect(kv_load_bytes=4, kv_lines=r"words = tl\.load|scale_words = ", tensor_cores=True,
                          max_regs=regs, max_spill_ops=spills),
        )
        # Registers: about 10% above the most measured under 3.6 / 3.8 / 3.9. Spills (STL + LDL):
        # sm_90's 4-query tile holds a [64, 256] fp32 accumulator, its 256 head weights and the key
        # decode in 255 registers: 3 / 33 / 8 spill instructions under 3.6 / 3.8 / 3.9 (8-64 B per
        # thread, L1-resident, the H200 runs 3.6); the 2-query tile on sm_120 under 3.8: 2
        for suffix, cfg, archs, regs, spills in (
            ("", INDEX_PREFILL_CONFIG, (90,), 255, 40),
            ("_q2", INDEX_PREFILL_CONFIG_Q2, (80, 100, 120), {80: 206, 100: 191, 120: 198}, 4),
            # sm_100 under 3.9: 83 -> 96 with the head-weight scale multiplied in the kernel (session 13)
            ("_decode", INDEX_DECODE_CONFIG, None, {80: 141, 90: 101, 100: 106, 120: 141}, 0),
        )
    ),
    KernelSpec(
        "indexer.decode_keys_fp8kv", f"{_OPS}.indexer_triton:_decode_keys_kernel",
        types=dict(k_ptr="*i32", rows_ptr="*i32", out_ptr="*bf16", T="i32", stride_k="i32", stride_rb="i32",
                   stride_ot="i32"),
        aligned=("k_ptr", "rows_ptr", "out_ptr", "stride_ot"), constexprs=dict(BLOCK_T=64, BLOCK_D=128),
        num_warps=4, num_stages=1,
        expect=Expect(kv_load_bytes=4, kv_lines=r"words = tl\.load|scale_words = ", max_regs=44),  # 40 measured
    ),
    # ---- writes: pack kernels, and the fused packed outputs of the window append and the compressor ----
    *(
        KernelSpec(
            f"kv_pack.store_{name}", f"{_OPS}.kv_pack_triton:_store_rows_kernel",
            types=dict(x_ptr="*bf16", rows_ptr="*i64", pool_ptr="*u8", D="i32", stride_x="i32", stride_pool="i32"),
            aligned=("x_ptr", "rows_ptr", "pool_ptr", "D", "stride_x") + (("stride_pool",) if name == "fp8" else ()),
            constexprs=dict(HAS_ROWS=True, BLOCK_D=dim, **pk), num_warps=store_warps(dim), num_stages=3,
            expect=Expect(max_regs=128),
        )
        for name, dim, pk in (("fp8", 512, _FP8), ("fp4", 128, _FP4))
    ),
    KernelSpec(
        "kv_pack.unpack_fp8", f"{_OPS}.kv_pack_triton:_unpack_rows_kernel",
        types=dict(packed_ptr="*u8", out_ptr="*bf16", N="i32", D="i32", stride_p="i32", stride_o="i32"),
        aligned=("packed_ptr", "out_ptr", "D", "stride_p", "stride_o"),
        constexprs=dict(BLOCK_R=16, BLOCK_D=512, **_LOAD_PK), num_warps=4, num_stages=3,
        expect=Expect(kv_load_bytes=16, kv_lines=_GATHER_LINES),
    ),
    KernelSpec(  # the window append: kv_norm (weighted) + rope 64 at D 512, packed into the window ring
        "norm_rope.kv_fp8kv", f"{_OPS}.norm_rope_triton:_rms_norm_rope_kernel",
        types=dict(x_ptr="*bf16", w_ptr="*bf16", cos_ptr="*fp32", sin_ptr="*fp32", out_ptr="*bf16", pool_ptr="*u8",
                   pool_rows_ptr="*i64", D="i32", R="i32", heads="i32", eps="fp32", stride_x="i32", stride_o="i32",
                   stride_cs="i32", stride_pool="i32"),
        aligned=("x_ptr", "w_ptr", "cos_ptr", "sin_ptr", "out_ptr", "pool_ptr", "pool_rows_ptr", "D", "stride_x",
                 "stride_o", "stride_pool"),
        constexprs=dict(PDL=False, NORM=True, HAS_WEIGHT=True, ROPE=True, INVERSE=False, BLOCK_D=512, heads=1,
                        PACKED=True, **_FP8, HADAMARD=False, LOG2_D=0),
        num_warps=2, num_stages=3, expect=Expect(max_regs=128),
    ),
    *(
        KernelSpec(
            f"compress_decode.{kind}_fp8kv", f"{_OPS}.compress_decode_triton:_compress_decode_kernel",
            types=compress_decode_types(pool_ptr="*u8"), aligned=(*COMPRESS_DECODE_ALIGNED, "stride_pool"),
            constexprs=dict(PDL=False, RATIO=ratio, OVERLAP=overlap, BLOCK_R=block_r, BLOCK_D=512, PACKED=True,
                            **_FP8, HADAMARD=False, LOG2_D=0),
            num_warps=4, num_stages=3, expect=Expect(max_regs=168),
        )
        for kind, ratio, overlap, block_r in (("csa", 4, True, 4), ("hca", 128, False, 1))
    ),
)

# The two-pass values pass over packed rows in Gluon (ops/sparse_attn_values_gluon.py, sm_90 only; a
# sweep variant, `VALUES_KERNEL="gluon"`): tiles' codes / tail and p in a cp.async ring of 4 stages (3 tiles ahead), the
# dequantized tile as wgmma's register A operand of the transposed dot; PDL as production launches it.
PACKED_KV_KERNELS += tuple(
    KernelSpec(
        f"sparse_attn.two_pass_values_fp8kv_gluon{'_2wg' if warpgroups == 2 else ''}_pdl", f"{_OPS}.sparse_attn_values_gluon:_values_packed_gluon_kernel",
        types=dict(win_ptr="*u8", cmp_ptr="*u8", idx_ptr="*i32", counts_ptr="*i32", sink_ptr="*fp32", p_ptr="*bf16",
                   m_ptr="*fp32", l_ptr="*fp32", out_ptr="*bf16", H="i32", C="i32", n_window="i32",
                   **dict.fromkeys(("stride_pool", "stride_it", "stride_pt", "stride_ph", "stride_mt", "stride_mj",
                                    "stride_ot", "stride_oh"), "i32")),
        aligned=("win_ptr", "cmp_ptr", "idx_ptr", "counts_ptr", "sink_ptr", "p_ptr", "m_ptr", "l_ptr", "out_ptr", "H",
                 "C", "n_window", "stride_pool", "stride_it", "stride_pt", "stride_ph", "stride_mt", "stride_mj",
                 "stride_ot", "stride_oh"),
        constexprs=dict(HAS_COUNTS=True, BLOCK_J=16, PK_NQ=_FP8["PK_NQ"], PK_BLOCK=_FP8["PK_BLOCK"],
                        PK_TAIL_OFF=_FP8["PK_TAIL_OFF"], PK_SCALE_OFF=_FP8["PK_SCALE_OFF"], STAGES=4, PDL=True,
                        WARPGROUPS=warpgroups),
        archs=(90,), num_warps=4, num_stages=1, maxnreg=VALUES_GLUON_MAX_REGS if warpgroups == 2 else None,
        expect=Expect(tensor_cores=True, max_regs=VALUES_GLUON_MAX_REGS),
    )
    for warpgroups in (1, 2)  # WARPGROUPS 2: the tiles alternate between two warp-specialised warpgroups
)

# The two-pass scores pass over packed rows in Gluon (ops/sparse_attn_scores_gluon.py, sm_90 only; a
# sweep variant, `SCORES_KERNEL="gluon"`): the tile's bytes in one round of 16-byte loads, each 64-channel
# block dequantized, stored and its MMA issued asynchronously while the next converts; Q by cp.async.
PACKED_KV_KERNELS += (
    KernelSpec(
        "sparse_attn.two_pass_scores_fp8kv_gluon_pdl", f"{_OPS}.sparse_attn_scores_gluon:_scores_packed_gluon_kernel",
        types=dict(q_ptr="*bf16", win_ptr="*u8", cmp_ptr="*u8", idx_ptr="*i32", counts_ptr="*i32", sink_ptr="*fp32",
                   p_ptr="*bf16", m_ptr="*fp32", l_ptr="*fp32", H="i32", C="i32", n_window="i32",
                   qk_scale_log2="fp32", **dict.fromkeys(("stride_qt", "stride_qh", "stride_pool", "stride_it",
                                                          "stride_pt", "stride_ph", "stride_mt", "stride_mj"), "i32")),
        aligned=("q_ptr", "win_ptr", "cmp_ptr", "idx_ptr", "counts_ptr", "sink_ptr", "p_ptr", "m_ptr", "l_ptr", "H",
                 "C", "n_window", "stride_qt", "stride_qh", "stride_pool", "stride_it", "stride_pt", "stride_ph",
                 "stride_mt", "stride_mj"),
        constexprs=dict(HAS_COUNTS=True, PK_NQ=_FP8["PK_NQ"], PK_TAIL_OFF=_FP8["PK_TAIL_OFF"],
                        PK_SCALE_OFF=_FP8["PK_SCALE_OFF"], PDL=True),
        archs=(90,), num_warps=4, num_stages=1,
        expect=Expect(tensor_cores=True, kv_load_bytes=16, kv_lines=r"codes = codes \+|tail = gl\.load"),
    ),
)
