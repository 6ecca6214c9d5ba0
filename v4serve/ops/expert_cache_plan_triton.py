"""Triton kernel of the expert-cache plan (math and state: expert_cache_plan_reference.py).

One program (a layer's plan is a few hundred experts and at most a few dozen slots), so the
steps that depend on each other are ordered by barriers inside it, not by launches:

    scratch [2E + S] int32 (global): [0, E) the step's used-expert flags, [E, 2E) member flags,
    [2E, 2E + S) the missing members in id order (their compact list, m <= S of them)

1. zero the used flags; scatter a 1 at every pick (and, with COUNT, atomically count it);
2. offloaded = used & host_row >= 0; rank = exclusive cumsum; member = rank // S == chunk;
   missing = member & index < 0, with its exclusive cumsum miss_rank and total m;
3. per slot: protected (holds a member: a gather from the member flags), victim rank
   vrank[s] = #{s' : key[s'] < key[s] or (key[s'] = key[s] and s' < s)} with key = stamp, or
   int64 max when protected (an [S, S] compare: no sort); slot s is filled iff vrank[s] < m and
   receives the missing member of rank vrank[s];
4. the state updates and the copy list (entry vrank[s] of the list is slot s: a permutation,
   so every entry is written), then `mapped` from the updated index (and, with RESIDENT_OUT,
   `resident_rows`: each pick's resident row, R + S for an offloaded expert).

Picks int64 [N]; host_row, index, counts int64 [E]; slot_expert, slot_stamp int64 [S]; clock,
fetches, copy_count int64 [1]; copy_slot, copy_src int64 [S]; mapped, resident_rows int64 [N].
No host sync.
"""

import torch
import triton
import triton.language as tl

PLAN_CONFIG = dict(BLOCK_N=1024, num_warps=4)


@triton.jit
def _expert_cache_plan_kernel(
    picks_ptr, host_row_ptr, index_ptr, slot_expert_ptr, slot_stamp_ptr, clock_ptr, fetches_ptr, counts_ptr,
    scratch_ptr, copy_count_ptr, copy_slot_ptr, copy_src_ptr, mapped_ptr, resident_ptr, N, E, S, chunk, n_resident,
    COUNT: tl.constexpr, WITH_RESIDENT: tl.constexpr, RESIDENT_OUT: tl.constexpr, BLOCK_E: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr,
):
    e = tl.arange(0, BLOCK_E)
    e_ok = e < E
    s = tl.arange(0, BLOCK_S)
    s_ok = s < S
    # 1. used flags
    tl.store(scratch_ptr + e, tl.zeros([BLOCK_E], dtype=tl.int32), mask=e_ok)
    tl.debug_barrier()
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < N
        p = tl.load(picks_ptr + n, mask=n_ok, other=0)
        tl.store(scratch_ptr + p, tl.full([BLOCK_N], 1, tl.int32), mask=n_ok)
        if COUNT:
            tl.atomic_add(counts_ptr + p, tl.full([BLOCK_N], 1, tl.int64), mask=n_ok)
    tl.debug_barrier()
    # 2. members and missing members
    used = tl.load(scratch_ptr + e, mask=e_ok, other=0)
    host = tl.load(host_row_ptr + e, mask=e_ok, other=-1)
    offloaded = ((used > 0) & (host >= 0)).to(tl.int32)
    rank = tl.cumsum(offloaded, 0) - offloaded
    member = (offloaded > 0) & (rank // S == chunk)
    index = tl.load(index_ptr + e, mask=e_ok, other=0)
    missing = (member & (index < 0)).to(tl.int32)
    m = tl.sum(missing, 0)
    miss_rank = tl.cumsum(missing, 0) - missing
    tl.store(scratch_ptr + E + e, member.to(tl.int32), mask=e_ok)
    tl.store(scratch_ptr + 2 * E + miss_rank, e, mask=missing > 0)
    tl.debug_barrier()
    # 3. victim order over the slots
    held_expert = tl.load(slot_expert_ptr + s, mask=s_ok, other=-1)
    held = held_expert >= 0
    protected = held & (tl.load(scratch_ptr + E + held_expert, mask=held & s_ok, other=0) > 0)
    stamp = tl.load(slot_stamp_ptr + s, mask=s_ok, other=0)
    top = 9223372036854775807
    key = tl.where(protected | (s >= S), top, stamp)
    earlier = (key[None, :] < key[:, None]) | ((key[None, :] == key[:, None]) & (s[None, :] < s[:, None]))
    vrank = tl.sum(earlier.to(tl.int32), 1)
    filled = (vrank < m) & s_ok
    new_expert = tl.load(scratch_ptr + 2 * E + vrank, mask=filled, other=-1).to(tl.int64)
    # 4. state, copy list, mapped rows
    tl.store(index_ptr + held_expert, tl.full([BLOCK_S], -1, tl.int64), mask=filled & held)
    tl.store(index_ptr + new_expert, n_resident + s.to(tl.int64), mask=filled)
    tl.store(slot_expert_ptr + s, new_expert, mask=filled)
    clock = tl.load(clock_ptr)
    tl.store(slot_stamp_ptr + s, tl.full([BLOCK_S], 0, tl.int64) + clock, mask=(filled | protected) & s_ok)
    src = tl.load(host_row_ptr + new_expert, mask=filled, other=-1)
    tl.store(copy_slot_ptr + vrank, tl.where(filled, s.to(tl.int64), -1), mask=s_ok)
    tl.store(copy_src_ptr + vrank, tl.where(filled, src, -1), mask=s_ok)
    tl.debug_barrier()
    tl.store(clock_ptr, clock + 1)
    tl.store(fetches_ptr, tl.load(fetches_ptr) + m)
    tl.store(copy_count_ptr, m.to(tl.int64))
    for n0 in range(0, N, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        n_ok = n < N
        p = tl.load(picks_ptr + n, mask=n_ok, other=0)
        in_pass = tl.load(scratch_ptr + E + p, mask=n_ok, other=0) > 0
        if WITH_RESIDENT:
            in_pass = in_pass | (tl.load(host_row_ptr + p, mask=n_ok, other=0) < 0)
        row = tl.load(index_ptr + p, mask=n_ok, other=0)
        tl.store(mapped_ptr + n, tl.where(in_pass, row, n_resident + S), mask=n_ok)
    if RESIDENT_OUT:  # a resident expert's index is its resident row
        for n0 in range(0, N, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            n_ok = n < N
            p = tl.load(picks_ptr + n, mask=n_ok, other=0)
            resident = tl.load(host_row_ptr + p, mask=n_ok, other=0) < 0
            row = tl.load(index_ptr + p, mask=n_ok, other=0)
            tl.store(resident_ptr + n, tl.where(resident, row, n_resident + S), mask=n_ok)


def expert_cache_plan_triton(picks, host_row, index, slot_expert, slot_stamp, clock, fetches, counts, copy_count,
                             copy_slot, copy_src, chunk: int, n_resident: int, with_resident: bool,
                             count_picks: bool, resident_rows: torch.Tensor | None = None) -> torch.Tensor:
    picks = picks.reshape(-1).contiguous()
    n_experts, n_slots = host_row.shape[0], slot_expert.shape[0]
    scratch = torch.empty(2 * n_experts + n_slots, dtype=torch.int32, device=picks.device)
    mapped = torch.empty_like(picks)
    _expert_cache_plan_kernel[(1,)](
        picks, host_row, index, slot_expert, slot_stamp, clock, fetches, counts, scratch, copy_count, copy_slot,
        copy_src, mapped, mapped if resident_rows is None else resident_rows, picks.shape[0], n_experts, n_slots,
        chunk, n_resident, COUNT=count_picks, WITH_RESIDENT=with_resident, RESIDENT_OUT=resident_rows is not None,
        BLOCK_E=triton.next_power_of_2(n_experts),
        BLOCK_S=triton.next_power_of_2(n_slots), **PLAN_CONFIG)
    return mapped
