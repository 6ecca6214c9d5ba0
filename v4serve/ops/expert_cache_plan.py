"""Expert-cache plan for offloaded MoE experts (one pass of a layer: members, slot assignment,
copy list, each pick's device row): public entry point (math and state in
expert_cache_plan_reference.py, kernel in expert_cache_plan_triton.py). Nothing leaves the device,
so an offloaded layer's decode step can be captured in a CUDA graph."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.expert_cache_plan_reference import expert_cache_plan_reference
from v4serve.ops.expert_cache_plan_triton import expert_cache_plan_triton


def expert_cache_plan(picks: torch.Tensor, host_row: torch.Tensor, index: torch.Tensor, slot_expert: torch.Tensor,
                      slot_stamp: torch.Tensor, clock: torch.Tensor, fetches: torch.Tensor, counts: torch.Tensor,
                      copy_count: torch.Tensor, copy_slot: torch.Tensor, copy_src: torch.Tensor, *, chunk: int,
                      n_resident: int, with_resident: bool = False, count_picks: bool = False,
                      resident_rows: torch.Tensor | None = None, impl: str = "auto") -> torch.Tensor:
    """`mapped` [N] (see the reference's docstring); updates the state and the copy list in place,
    and writes `resident_rows` [N] (int64) when given."""
    n_experts, n_slots = host_row.shape[0], slot_expert.shape[0]
    if picks.dtype != torch.int64 or n_slots < 1:
        raise ValueError(f"picks must be int64 and there must be at least one slot (got {picks.dtype}, {n_slots} slots)")
    for name, t, size in (("index", index, n_experts), ("counts", counts, n_experts), ("slot_stamp", slot_stamp, n_slots),
                          ("copy_slot", copy_slot, n_slots), ("copy_src", copy_src, n_slots), ("clock", clock, 1),
                          ("fetches", fetches, 1), ("copy_count", copy_count, 1)):
        if t.shape != (size,) or t.dtype != torch.int64 or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous int64 [{size}] tensor, got {t.dtype} {tuple(t.shape)}")
    if resident_rows is not None and (resident_rows.shape != (picks.numel(),) or resident_rows.dtype != torch.int64
                                      or not resident_rows.is_contiguous()):
        raise ValueError(f"resident_rows must be a contiguous int64 [{picks.numel()}] tensor, "
                         f"got {resident_rows.dtype} {tuple(resident_rows.shape)}")
    run = expert_cache_plan_triton if use_triton(impl, picks) else expert_cache_plan_reference
    return run(picks, host_row, index, slot_expert, slot_stamp, clock, fetches, counts, copy_count, copy_slot,
               copy_src, chunk, n_resident, with_resident, count_picks, resident_rows)
