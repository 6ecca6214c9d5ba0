"""Codegen registry entries of the indexer's top-k (v4serve/ops/index_topk_triton.py), in their own
file so that merges with other registry edits stay trivial; registry.py appends INDEX_TOPK_KERNELS.

- `index_topk.row_k512` / `row_k1024`: the one-launch schedule (FINAL over fp32 scores: radix select,
  compaction, bitonic sort of the picks), V4-Flash's top-512 and V4-Pro's top-1024;
- `index_topk.split_k512`: the split schedule's first launch (a chunk's picks into the workspace);
- `index_topk.merge_k512`: its second launch (FROM_KEYS: the same steps over the chunks' int64 keys);
- `index_topk.sort_all_4096`: the sort-everything schedule (production up to 1024 keys) at its widest row (4096 keys);
- `index_topk.live_k512`: the decode step's one launch with the live bound (LIVE: a live prefix of
  up to 1024 columns sorted whole, else the select over it; both bodies in one kernel);
- `index_topk.live_split_k512` / `live_merge_k512`: the split schedule's two launches with it.
All at the production loop step (BLOCK 2048, 8 warps). Registers (Triton 3.6): 64-80, no spill; the
sort-everything entry 104-128 (16 int64 keys a thread), hence its own bound. The scores' row stride is T (a multiple of
16 at every cache width); the counts n_cols / K / chunk are left unaligned (any T and k).
"""
from v4serve.ops.index_topk_triton import BLOCK, NUM_WARPS, SORT_ALL_COLUMNS, SORT_ALL_RULE_COLUMNS

from .spec import Expect, KernelSpec

_TYPES = dict(src_ptr="*fp32", score_ptr="*fp32", out_ptr="*i64", val_ptr="*fp32", col_ptr="*i64", n_cols="i32",
              K="i32", chunk="i32", stride_sb="i32", stride_vb="i32", stride_cb="i32", live_ptr="*i32", n_row="i32")
_ALIGNED = ("src_ptr", "score_ptr", "out_ptr", "val_ptr", "col_ptr", "stride_sb")


def _spec(name: str, k: int, from_keys: bool, final: bool, mark: bool, sort_all: bool = False,
          max_regs: int = 128, live_lanes: int = 0) -> KernelSpec:
    types = dict(_TYPES, src_ptr="*i64") if from_keys else _TYPES
    return KernelSpec(
        name, "v4serve.ops.index_topk_triton:_index_topk_kernel", types=types, aligned=_ALIGNED,
        constexprs=dict(FROM_KEYS=from_keys, FINAL=final, MARK=mark, WRITE_VALUES=True, BLOCK=BLOCK, KP=k,
                        SORT_ALL=sort_all, LIVE=live_lanes > 0, KS=max(live_lanes, 1), PDL=False),
        num_warps=NUM_WARPS, num_stages=1, expect=Expect(max_regs=max_regs),
    )


INDEX_TOPK_KERNELS = (
    _spec("index_topk.row_k512", 512, from_keys=False, final=True, mark=False),
    _spec("index_topk.row_k1024", 1024, from_keys=False, final=True, mark=True),
    _spec("index_topk.split_k512", 512, from_keys=False, final=False, mark=False),
    _spec("index_topk.merge_k512", 512, from_keys=True, final=True, mark=False),
    _spec("index_topk.sort_all_4096", SORT_ALL_COLUMNS, from_keys=False, final=True, mark=False, sort_all=True,
          max_regs=160),
    _spec("index_topk.live_k512", 512, from_keys=False, final=True, mark=False, live_lanes=SORT_ALL_RULE_COLUMNS,
          max_regs=160),
    _spec("index_topk.live_split_k512", 512, from_keys=False, final=False, mark=False,
          live_lanes=SORT_ALL_RULE_COLUMNS, max_regs=160),
    _spec("index_topk.live_merge_k512", 512, from_keys=True, final=True, mark=False, live_lanes=SORT_ALL_RULE_COLUMNS,
          max_regs=160),
)
