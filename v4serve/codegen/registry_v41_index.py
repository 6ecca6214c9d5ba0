"""Codegen registry entries of the DeepSeek-V4.1 indexer kernels (ops/v41_index_triton.py and
v41_index_stream_triton.py), kept in
their own file so that merges with other registry edits stay trivial. registry.py appends
V41_INDEX_KERNELS to KERNELS.

Shapes: 32 index heads x 128, keys fp4_e8m0_b32 (68-byte rows read as 17 int32 words: the pool
pointer 16-byte aligned, its row stride 17 words not), weights fp32. At the PR's 13 shapes every
column count (R, or 2048 candidate blocks x 8) is a multiple of 16, so the output strides are
aligned; a decode step's one query per sequence makes the n_visible stride 1 (specialised). Each
production launch: the tiles kernel (prefill: TILES_CONFIG on sm_90 / sm_100, TILES_CONFIG_MMA_SYNC
elsewhere) and the streaming kernel (STREAM_CONFIG on sm_90 / sm_100, STREAM_CONFIG_MMA_SYNC
elsewhere) in full-mode decode, candidate decode and a candidate prefill chunk. The rows kernel and
the predecoded launches are benchmark variants only (bench/v41_index_configs.py), not compiled here.
Expectations: the key words and scale words are 4-byte loads (no load narrower than 4 bytes
anywhere), tensor-core MMAs, no spills. Register bounds are not set yet (no measurement): 255, the
hardware's maximum.
"""
from v4serve.ops.v41_index_stream_triton import STREAM_CONFIG, STREAM_CONFIG_MMA_SYNC
from v4serve.ops.v41_index_triton import TILES_CONFIG, TILES_CONFIG_MMA_SYNC

from .spec import Expect, KernelSpec

_FN = "v4serve.ops.v41_index_triton"
_STRIDES = ("stride_qb", "stride_qs", "stride_qh", "stride_wb", "stride_ws", "stride_k", "stride_rb", "stride_nb")
_POINTERS = dict(q_ptr="*bf16", w_ptr="*fp32", k_ptr="*i32", rows_ptr="*i32", n_visible_ptr="*i32")
_KEY_WORDS = Expect(kv_load_bytes=4, kv_lines=r"codes = tl\.load|scale_word = tl\.load", tensor_cores=True)
_LAUNCH = ("num_warps", "num_stages")


def _stream_entry(name, candidates, prefill=False, config=STREAM_CONFIG, archs=(90, 100)):
    """A streaming launch (v41_index_stream_triton.py), weights as int32 words of two bf16 heads. A
    decode step has one query per sequence (n_visible's stride 1, specialised); a candidate prefill
    chunk (S 128 at the PR shapes) skips tiles of empty slots (SKIP_EMPTY, found by SKIP_BY_LIST).
    EARLY_CHAIN, SPLIT_STORE and TRIGGER as production (the loads ordered for griddepcontrol.wait, the two
    masked stores; PDL off here as before, so the wait and the trigger are not emitted: sm_80 has no such
    instructions)."""
    strides = [s for s in (*_STRIDES, "stride_cb", "stride_cs", "stride_ob", "stride_os")
               if s != "stride_nb" or prefill]
    return KernelSpec(
        name, "v4serve.ops.v41_index_stream_triton:_v41_scores_stream_kernel",
        types=dict(_POINTERS, w_ptr="*i32", cand_ptr="*i32", out_ptr="*bf16", H="i32", R="i32", C="i32",
                   **dict.fromkeys(strides, "i32")),
        aligned=("q_ptr", "w_ptr", "k_ptr", "rows_ptr", "n_visible_ptr", "cand_ptr", "out_ptr", "H", "R", "C",
                 *(s for s in strides if s not in ("stride_k", "stride_wb", "stride_ws"))),
        constexprs=dict(**({} if prefill else {"stride_nb": 1}), D=128, BLOCK_H=32, CAND_BLOCK=8,
                        CANDIDATES=candidates, PACKED=True, PREDECODED=False, SKIP_EMPTY=prefill, PACKED_MATH=True,
                        PDL=False, EARLY_CHAIN=True, SPLIT_STORE=True, TRIGGER=True, SKIP_BY_LIST=prefill,
                        BLOCK_T=config["BLOCK_T"]),
        num_warps=config["num_warps"], num_stages=config["num_stages"], archs=archs,
        expect=Expect(kv_load_bytes=4, kv_lines=r"codes = tl\.load|scales = tl\.load", tensor_cores=True),
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
    # stream_config(): 128-slot tiles with warpgroup MMAs, 64 on mma.sync GPUs
    *(_stream_entry(f"v41_index.stream_{kind}{suffix}", candidates=kind != "full", prefill=kind.endswith("prefill"),
                    config=config, archs=archs)
      for suffix, config, archs in (("", STREAM_CONFIG, (90, 100)), ("_mma_sync", STREAM_CONFIG_MMA_SYNC, (80, 120)))
      for kind in ("full", "candidates", "candidates_prefill")),
)
