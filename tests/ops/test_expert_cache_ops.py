"""Expert cache plan and expert fetch (offloaded MoE experts): the torch reference and the Triton
kernel (interpreted on the CPU) against a plain-Python model of the cache written from the rules
in expert_cache_plan_reference.py's docstring, over sequences of steps (slots reused, LRU
eviction, passes of a step split into chunks, resident experts); the fetch against direct row
copies; on the GPU, a fetch that reads pinned host memory, captured in a CUDA graph."""

from __future__ import annotations

import pytest
import torch

from v4serve.ops.expert_cache_plan import expert_cache_plan
from v4serve.ops.expert_fetch import expert_fetch


class PythonCache:
    """The cache rules, one expert at a time."""

    def __init__(self, host_row: list[int], n_resident: int, n_slots: int):
        self.host_row, self.r, self.s = host_row, n_resident, n_slots
        resident = [e for e, h in enumerate(host_row) if h < 0]
        self.index = [-1] * len(host_row)
        for row, e in enumerate(resident):
            self.index[e] = row
        self.slots, self.stamps, self.clock, self.fetches = [-1] * n_slots, [-1] * n_slots, 0, 0
        self.counts = [0] * len(host_row)

    def plan(self, picks: list[int], chunk: int, with_resident: bool, count: bool):
        if count:
            for p in picks:
                self.counts[p] += 1
        offloaded = sorted({p for p in picks if self.host_row[p] >= 0})
        members = set(offloaded[chunk * self.s:(chunk + 1) * self.s])
        protected = {s for s in range(self.s) if self.slots[s] in members}
        missing = [e for e in sorted(members) if self.index[e] < 0]
        victims = sorted((s for s in range(self.s) if s not in protected), key=lambda s: (self.stamps[s], s))
        copies = []
        for e, s in zip(missing, victims):
            if self.slots[s] >= 0:
                self.index[self.slots[s]] = -1
            self.slots[s], self.index[e] = e, self.r + s
            copies.append((s, self.host_row[e]))
        for s in range(self.s):
            if self.slots[s] in members:
                self.stamps[s] = self.clock
        self.clock += 1
        self.fetches += len(missing)
        mapped = [self.index[p] if p in members or (with_resident and self.host_row[p] < 0) else self.r + self.s
                  for p in picks]
        return mapped, copies


def _state(host_row: list[int], n_resident: int, n_slots: int, device="cpu"):
    e = len(host_row)
    index = torch.full((e,), -1, dtype=torch.long)
    resident = [x for x, h in enumerate(host_row) if h < 0]
    index[resident] = torch.arange(len(resident))
    z = lambda n, v=0: torch.full((n,), v, dtype=torch.long, device=device)  # noqa: E731
    return dict(host_row=torch.tensor(host_row, device=device), index=index.to(device), slot_expert=z(n_slots, -1),
                slot_stamp=z(n_slots, -1), clock=z(1), fetches=z(1), counts=z(e), copy_count=z(1),
                copy_slot=z(n_slots), copy_src=z(n_slots))


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("n_experts,n_host,n_slots,k", [(8, 6, 4, 2), (37, 20, 5, 3), (16, 16, 3, 4)])
def test_plan_follows_the_cache_rules_over_many_steps(impl, n_experts, n_host, n_slots, k):
    g = torch.Generator().manual_seed(n_experts * 100 + n_slots)
    host_ids = torch.randperm(n_experts, generator=g)[:n_host].sort().values.tolist()
    host_row = [-1] * n_experts
    for row, e in enumerate(host_ids):
        host_row[e] = row
    n_resident = n_experts - n_host
    model, state = PythonCache(host_row, n_resident, n_slots), _state(host_row, n_resident, n_slots)
    for step in range(12):
        tokens = [1, 2, 9, 1, 30][step % 5]  # decode-sized and prefill-sized steps
        picks = torch.randint(0, n_experts, (tokens, k), generator=g)
        picks[0, 0] = host_ids[step % n_host]  # some offloaded expert in every step
        n_chunks = -(-min(picks.numel(), n_host) // n_slots)
        with_resident = step % 2 == 0
        for chunk in range(n_chunks):
            want_mapped, want_copies = model.plan(picks.flatten().tolist(), chunk, with_resident, chunk == 0)
            resident_rows = torch.full((picks.numel(),), -7)
            mapped = expert_cache_plan(picks, **state, chunk=chunk, n_resident=n_resident,
                                       with_resident=with_resident, count_picks=chunk == 0,
                                       resident_rows=resident_rows, impl=impl)
            assert mapped.tolist() == want_mapped
            # each pick's resident row (the model's index of a resident expert), R + S if offloaded
            assert resident_rows.tolist() == [model.index[e] if host_row[e] < 0 else n_resident + n_slots
                                              for e in picks.flatten().tolist()]
            m = int(state["copy_count"])
            assert m == len(want_copies)
            assert list(zip(state["copy_slot"][:m].tolist(), state["copy_src"][:m].tolist())) == want_copies
            assert state["copy_slot"][m:].tolist() == [-1] * (n_slots - m)
            assert state["index"].tolist() == model.index and state["slot_expert"].tolist() == model.slots
            assert state["slot_stamp"].tolist() == model.stamps and int(state["clock"]) == model.clock
            assert int(state["fetches"]) == model.fetches and state["counts"].tolist() == model.counts
    assert model.fetches > n_slots  # slots were reused


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_fetch_copies_the_listed_rows(impl):
    g = torch.Generator().manual_seed(3)
    src = torch.randint(0, 256, (5, 3, 48), generator=g, dtype=torch.uint8)  # 144-byte rows
    dst = torch.randint(0, 256, (6, 3, 48), generator=g, dtype=torch.uint8)
    before = dst.clone()
    count, slots, rows = torch.tensor([2]), torch.tensor([3, 0, 1, -1]), torch.tensor([4, 1, 2, -1])
    expert_fetch(src, dst, count, slots, rows, dst_row0=2, impl=impl)
    want = before.clone()
    want[2 + 3], want[2 + 0] = src[4], src[1]  # entry 2 is past the count: not copied
    assert torch.equal(dst, want)
    count.zero_()
    expert_fetch(src, dst, count, slots, rows, dst_row0=2, impl=impl)
    assert torch.equal(dst, want)


def test_fetch_refuses_rows_it_cannot_move_in_16_byte_words():
    src, dst = torch.zeros(2, 10, dtype=torch.uint8), torch.zeros(3, 10, dtype=torch.uint8)
    with pytest.raises(ValueError, match="multiple of 16"):
        expert_fetch(src, dst, torch.tensor([1]), torch.tensor([0]), torch.tensor([0]), 0)


@pytest.mark.gpu
def test_fetch_reads_pinned_host_memory_inside_a_cuda_graph():
    """The kernel reads the host rows over the host link (unified addressing); a captured fetch
    replays with the copy list of the replay, not of the capture."""
    src = torch.randint(0, 256, (6, 4096, 1024), dtype=torch.uint8).pin_memory()  # 4 MiB rows
    dst = torch.zeros(5, 4096, 1024, dtype=torch.uint8, device="cuda")
    count, slots, rows = (torch.zeros(n, dtype=torch.long, device="cuda") for n in (1, 3, 3))
    expert_fetch(src, dst, count, slots, rows, dst_row0=2)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        expert_fetch(src, dst, count, slots, rows, dst_row0=2)
    count.fill_(2)
    slots.copy_(torch.tensor([2, 0, -1]))
    rows.copy_(torch.tensor([5, 3, -1]))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dst[4].cpu(), src[5]) and torch.equal(dst[2].cpu(), src[3])
    assert not dst[3].any() and not dst[0].any()
