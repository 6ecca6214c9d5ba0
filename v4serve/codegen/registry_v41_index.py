"""Codegen registry entries of the DeepSeek-V4.1 indexer kernels (ops/v41_index_triton.py), kept in
their own file so that merges with other registry edits stay trivial. registry.py appends
V41_INDEX_KERNELS to KERNELS.

Shapes: 32 index heads x 128, keys fp4_e8m0_b32 (68-byte rows read as 17 int32 words: the pool
pointer 16-byte aligned, its row stride 17 words not), weights fp32. At the PR's 13 shapes every
column count (R, or 2048 candidate blocks x 8) is a multiple of 16, so the output strides are
aligned; a decode step's one query per sequence makes the n_visible stride 1 (specialised). Each
production launch: the tiles kernel (prefill: TILES_CONFIG on sm_90 / sm_100, TILES_CONFIG_MMA_SYNC
elsewhere), the rows kernel in full mode (decode) and in candidate mode (ROWS_CONFIG), and a
candidate prefill chunk's two launches (the keys decoded once, then the rows kernel over them).
Expectations: the key words and scale words are 4-byte loads (no load narrower than 4 bytes
anywhere), tensor-core MMAs, no spills. Register bounds are not set yet (no measurement): 255, the
hardware's maximum.
"""
from v4serve.ops.v41_index_triton import (
    DECODE_ROWS, ROWS_CONFIG, ROWS_CONFIG_MANY, ROWS_CONFIG_PREDECODED, TILES_CONFIG, TILES_CONFIG_MMA_SYNC)

from .spec import Expect, KernelSpec

_FN = "v4serve.ops.v41_index_triton"
_STRIDES = ("stride_qb", "stride_qs", "stride_qh", "stride_wb", "stride_ws", "stride_k", "stride_rb", "stride_nb")
_POINTERS = dict(q_ptr="*bf16", w_ptr="*fp32", k_ptr="*i32", rows_ptr="*i32", n_visible_ptr="*i32")
_KEY_WORDS = Expect(kv_load_bytes=4, kv_lines=r"codes = tl\.load|scale_word = tl\.load", tensor_cores=True)
_LAUNCH = ("num_warps", "num_stages")


def _rows_entry(name, candidates, config=ROWS_CONFIG, packed=True):
    """A decode launch (one query per sequence: stride_nb is 1; full mode passes stride_cs 0).
    packed=False: the candidate prefill over the keys decoded once (bf16 rows of 256 B)."""
    strides = [s for s in (*_STRIDES, "stride_cb", "stride_cs", "stride_ob", "stride_os") if s != "stride_nb"]
    return KernelSpec(
        name, f"{_FN}:_v41_scores_rows_kernel",
        types=dict(_POINTERS, k_ptr="*i32" if packed else "*bf16", cand_ptr="*i32", out_ptr="*bf16", H="i32",
                   R="i32", C="i32", **dict.fromkeys(strides, "i32")),
        aligned=("q_ptr", "w_ptr", "k_ptr", "rows_ptr", "n_visible_ptr", "cand_ptr", "out_ptr", "H", "R", "C",
                 *(s for s in strides if s != "stride_k" or not packed)),
        constexprs=dict(stride_nb=1, D=128, BLOCK_H=32,
                        CAND_BLOCK=8, PACKED=packed, CANDIDATES=candidates, PDL=False,
                        **{k: v for k, v in config.items() if k not in _LAUNCH}),
        num_warps=config["num_warps"], num_stages=config["num_stages"],
        expect=_KEY_WORDS if packed else Expect(kv_load_bytes=16, kv_lines=r"keys = tl\.load", tensor_cores=True),
    )


def _tiles_entry(name, config, archs):
    """A prefill chunk of one sequence (B 1): S and R as at the PR shapes (multiples of 16)."""
    return KernelSpec(
        name, f"{_FN}:_v41_scores_tiles_kernel",
        types=dict(_POINTERS, out_ptr="*bf16", S="i32", H="i32", R="i32",
                   **dict.fromkeys((*_STRIDES, "stride_ob", "stride_os"), "i32")),
        aligned=("q_ptr", "w_ptr", "k_ptr", "rows_ptr", "n_visible_ptr", "out_ptr", "S", "H", "R", "stride_qb",
                 "stride_qs", "stride_qh", "stride_wb", "stride_ws", "stride_rb", "stride_nb", "stride_ob",
                 "stride_os"),
        constexprs=dict(D=128, PACKED=True, PDL=False, **{k: v for k, v in config.items() if k not in _LAUNCH}),
        num_warps=config["num_warps"], num_stages=config["num_stages"], archs=archs, expect=_KEY_WORDS,
    )


V41_INDEX_KERNELS: tuple[KernelSpec, ...] = (
    _tiles_entry("v41_index.tiles", TILES_CONFIG, (90, 100)),  # tiles_config(): warpgroup MMAs
    _tiles_entry("v41_index.tiles_mma_sync", TILES_CONFIG_MMA_SYNC, (80, 120)),
    _rows_entry("v41_index.rows_full", candidates=False),
    _rows_entry("v41_index.rows_candidates", candidates=True),
    _rows_entry("v41_index.rows_candidates_many", candidates=True, config=ROWS_CONFIG_MANY),
    _rows_entry("v41_index.rows_candidates_predecoded", candidates=True, config=ROWS_CONFIG_PREDECODED,
                packed=False),
    KernelSpec(  # the candidate prefill's keys decoded once (PREDECODE_REUSE)
        "v41_index.decode_keys", f"{_FN}:_v41_decode_keys_kernel",
        types=dict(words_ptr="*i32", rows_ptr="*i32", out_ptr="*bf16", N="i32", row_words="i32"),
        aligned=("words_ptr", "rows_ptr", "out_ptr", "N"),
        constexprs=dict(D=128, BLOCK_R=DECODE_ROWS), num_warps=4, num_stages=2,
        expect=Expect(kv_load_bytes=4, kv_lines=r"codes = tl\.load|scale_word = tl\.load"),
    ),
)
