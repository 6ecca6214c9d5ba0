"""Torch reference of the expert-cache plan: which offloaded experts one pass of an MoE layer
computes, which device slots receive the ones missing, and each pick's device row.

A layer keeps R resident experts in device rows 0..R-1 and S cache slots in rows R..R+S-1; the
other experts live in host memory (`host_row[e]` >= 0 is their host row, -1 for a resident
expert). State, updated in place (all on the device, so the plan runs inside a CUDA graph):

    index [E]        expert -> device row (resident row, or R + slot while a slot holds it), -1 else
    slot_expert [S]  expert held by each slot, -1 for an empty slot
    slot_stamp [S]   the clock value of the slot's last use (-1 never used)
    clock [1]        plans run so far (the LRU clock); fetches [1] experts copied so far
    counts [E]       picks per expert (placement by measured use), when `count_picks`

A step's offloaded experts (the distinct experts picked with host_row >= 0) are ranked by id;
pass `chunk` serves the ones of rank [chunk S, (chunk + 1) S) (its members, at most S). Members
already in a slot keep it ("protected"); every missing member takes the least recently used
unprotected slot (empty slots first, ties by slot number), in expert-id order:

    missing   = members with index < 0            m = |missing|
    victims   = unprotected slots by (stamp, slot) ascending; the j-th missing expert -> victims[j]
    evicted experts: index -1; filled slot s: index[new] = R + s, slot_expert[s] = new
    slot_stamp = clock for every slot holding a member; clock += 1; fetches += m

Outputs: the copy list (`copy_count` [1] = m; `copy_slot` [S], `copy_src` [S]: entry j < m copies
host row copy_src[j] into slot copy_slot[j]; entries >= m are -1) and `mapped` [N], each pick's
device row when its expert is a member (or resident, with `with_resident`), else R + S (a group
past the last row: the MoE sorts such picks last and computes them in no group). Given
`resident_rows` [N], the plan also writes there each pick's resident row (R + S for an offloaded
expert): the groups of a separate pass over the resident experts, without a launch of its own.
"""

from __future__ import annotations

import torch


def expert_cache_plan_reference(picks: torch.Tensor, host_row: torch.Tensor, index: torch.Tensor,
                                slot_expert: torch.Tensor, slot_stamp: torch.Tensor, clock: torch.Tensor,
                                fetches: torch.Tensor, counts: torch.Tensor, copy_count: torch.Tensor,
                                copy_slot: torch.Tensor, copy_src: torch.Tensor, chunk: int, n_resident: int,
                                with_resident: bool, count_picks: bool,
                                resident_rows: torch.Tensor | None = None) -> torch.Tensor:
    picks = picks.reshape(-1)
    n_experts, n_slots = host_row.shape[0], slot_expert.shape[0]
    device = picks.device
    if count_picks:
        counts.index_add_(0, picks, torch.ones_like(picks, dtype=counts.dtype))
    used = torch.zeros(n_experts, dtype=torch.bool, device=device)
    used[picks] = True
    offloaded = used & (host_row >= 0)
    rank = torch.cumsum(offloaded.long(), 0) - offloaded.long()
    member = offloaded & (rank // n_slots == chunk)
    missing = member & (index < 0)
    m = missing.sum()
    held = slot_expert >= 0
    protected = held & member[slot_expert.clamp(min=0)]
    # Victim order: unprotected slots by (stamp, slot number), protected ones after every other.
    key = torch.where(protected, torch.iinfo(torch.int64).max, slot_stamp)
    order = torch.argsort(key, stable=True)
    victim_rank = torch.empty_like(order)
    victim_rank[order] = torch.arange(n_slots, device=device)
    filled = victim_rank < m
    missing_in_id_order = torch.argsort((~missing).to(torch.int8), stable=True)  # missing experts first
    new_expert = torch.where(filled, missing_in_id_order[victim_rank.clamp(max=n_experts - 1)], -1)
    # index: evicted experts -1, newly held experts their slot's row.
    experts = torch.arange(n_experts, device=device)
    evicted = ((slot_expert[:, None] == experts[None, :]) & (filled & held)[:, None]).any(0)
    gains = (new_expert[:, None] == experts[None, :]) & filled[:, None]  # [S, E]
    new_row = n_resident + (gains.long() * torch.arange(n_slots, device=device)[:, None]).sum(0)
    index.copy_(torch.where(gains.any(0), new_row, torch.where(evicted, -1, index)))
    slot_expert.copy_(torch.where(filled, new_expert, slot_expert))
    slot_stamp.copy_(torch.where(filled | protected, clock, slot_stamp))
    clock.add_(1)
    fetches.add_(m)
    copy_count.copy_(m.reshape(1))
    first = order  # the slot of victim rank j, j = 0..S-1
    copy_slot.copy_(torch.where(filled[first], first, -1))
    copy_src.copy_(torch.where(filled[first], host_row[new_expert[first].clamp(min=0)], -1))
    in_pass = member[picks]
    resident = host_row[picks] < 0
    if with_resident:
        in_pass |= resident
    if resident_rows is not None:
        resident_rows.copy_(torch.where(resident, index[picks], n_resident + n_slots))
    return torch.where(in_pass, index[picks], n_resident + n_slots)
