"""Routed experts partly in host memory (`cpu_offload_gb`): one `ExpertOffload` per MoE layer.

Layout, per expert tensor t of the layer (EXPERT_TENSORS, leading dim = expert):

    device[t]  [R + S, ...]   rows 0..R-1: the R resident experts; rows R..R+S-1: S cache slots
    host[t]    [H, ...]       the H = E - R offloaded experts, pinned (on CUDA) host memory

and the cache state, on the device (ops/expert_cache_plan_reference.py says how it changes):
`index` [E] (expert -> device row, -1 while only on the host), `slot_expert`, `slot_stamp` (LRU),
`counts` [E] (picks per expert: placement by measured use), `fetches` (experts copied).

A step never leaves the device, so an offloaded model decodes in CUDA graphs like any other:

    chunks  = ceil(min(picks, H) / S)          from shapes only: no host read of the routing
    pass "resident" (CUDA): the resident experts' picks, while chunk 0's experts are fetched
    pass c = 0..chunks-1:   plan (the c-th S offloaded experts the step picked, by id: slots for
                            the missing ones, LRU) -> fetch (the SMs read the host rows over the
                            host link, ops/expert_fetch.py, on a side stream) -> their picks
    combine                 one moe_combine of every pick's output (pick order)

Each pass computes the expert outputs of its members' picks; the other picks carry the group id
R + S, past the last row, and read no weights (so never a slot being written). Two routes, chosen
per step from shapes (`run`):

- decode (`MXFP4Experts.decodes_in_passes`: V4's numerics where the resident layer decodes
  sort-free, `direct_applies`; any number of chunks): a pass is the sort-free route's gate_up and
  down launches (`MXFP4Experts.pass_outputs`, ops/mxfp4_moe_decode.py `mxfp4_experts_pass`: the
  GEMV, or tensor cores where `bind_decode` chose them) whose programs skip the picks of id R + S
  (no load, no store); each pass writes its picks' rows of the same hidden and y. A step of one
  chunk (V4-Flash, offload auto, c1) on CUDA: the plan (which also writes the resident pass's
  group ids), 2 + 2 MoE launches, the combine (4 fetches on the side stream); a further chunk a
  plan and 2.
- otherwise (prefill, V4.1, the torch ops): a pass sorts its picks (`MXFP4Experts.pick_outputs`:
  the others sorted last, computed by no group), gathers its rows back to pick order and keeps
  them over the earlier passes' (`torch.where`).

Either way every pick keeps its output from its expert's pass, with the bits the resident layer
gives it (the same kernels and tiles on the same x row and expert weights; `pick_outputs` and
ops/mxfp4_moe_decode.py say why), and one combine sums each token's picks in slot order: the
result is bit-identical to the model with every expert resident. A chunk with no member costs its
launches (a plan, four empty fetches, the MoE kernels over no pick): at decode only the first
chunk usually has members. On the CPU nothing runs beside the compute: the resident experts join
chunk 0's pass. The plan and the fetch run their Triton kernels on CUDA whatever the model's
`kernels` (the torch fetch reads the copy count on the host, which a graph cannot capture), their
torch references on the CPU.
Layer-ahead prefetch (model/expert_prefetch.py, off by default): the next layer's router applied
to this layer's input guesses its picks; `prefetch` plans and fetches those into the next
layer's slots early, on its side stream.
"""

from __future__ import annotations

import torch

from v4serve.model.quantized import EXPERT_TENSORS
from v4serve.ops.expert_cache_plan import expert_cache_plan
from v4serve.ops.expert_fetch import expert_fetch
from v4serve.ops.moe_combine import moe_combine


PREFETCH_MAX_PICKS = 512  # layer-ahead prefetch (model/expert_prefetch.py) for steps of up to this many picks
# Production's rule, one line: decode steps run the sort-free passes (the module docstring's
# "decode" route; docs/performance.md, "Session 15: offloaded layers decode sort-free"); False =
# the sorted passes at every size (the same bits either way).
SORT_FREE_PASSES = True


class ExpertOffload:
    def __init__(self, module: torch.nn.Module, host_experts: list[int], n_slots: int, device: torch.device):
        shapes = {n: tuple(getattr(module, n).shape) for n in EXPERT_TENSORS}
        dtypes = {n: getattr(module, n).dtype for n in EXPERT_TENSORS}
        self.n_experts = e = shapes[EXPERT_TENSORS[0]][0]
        host_experts = sorted(host_experts)
        if len(set(host_experts)) != len(host_experts) or not all(0 <= x < e for x in host_experts):
            raise ValueError(f"host experts must be distinct ids in [0, {e}), got {host_experts}")
        if host_experts and n_slots < 1:
            raise ValueError("an offloaded layer needs at least one device slot")
        self.n_slots = s = n_slots if host_experts else 0
        host = set(host_experts)
        resident = [x for x in range(e) if x not in host]
        r, h = len(resident), len(host_experts)
        self.device = device
        self.device_tensors = [torch.empty((r + s, *shapes[n][1:]), dtype=dtypes[n], device=device) for n in EXPERT_TENSORS]
        self.host_tensors = [torch.empty((h, *shapes[n][1:]), dtype=dtypes[n], pin_memory=device.type == "cuda")
                             for n in EXPERT_TENSORS]
        self.row_of = {x: i for i, x in enumerate(resident)}  # resident expert -> device row
        self.host_row = {x: i for i, x in enumerate(host_experts)}  # offloaded expert -> host row
        long = dict(dtype=torch.long, device=device)
        self.host_row_of = torch.empty(e, **long)  # expert -> host row, -1 if resident
        self.index = torch.empty(e, **long)
        self.slot_expert, self.slot_stamp = torch.empty(max(s, 1), **long), torch.empty(max(s, 1), **long)
        self.clock, self._fetches, self.copy_count = (torch.zeros(1, **long) for _ in range(3))
        self.copy_slot, self.copy_src = torch.empty(max(s, 1), **long), torch.empty(max(s, 1), **long)
        self.counts = torch.zeros(e, **long)
        self.prefetch_picks = torch.empty(PREFETCH_MAX_PICKS, **long)  # guessed picks, read on the side stream
        self.prefetch_pending = False  # a prefetch is queued on the side stream: wait before planning
        self._write_tables()
        self.multi_chunk_steps = 0  # eager steps (prefill) whose offloaded experts needed several chunks
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # CUDA: the resident experts compute in a pass of their own while chunk 0 is fetched (the
        # fetch occupies a few SMs' warps); the CPU runs one pass fewer.
        self.overlap = device.type == "cuda"

    @property
    def resident(self) -> list[int]:
        return sorted(self.row_of, key=self.row_of.get)

    @property
    def host_experts(self) -> list[int]:
        return sorted(self.host_row, key=self.host_row.get)

    @property
    def fetches(self) -> int:
        """Experts copied host -> slot so far (reads the device)."""
        return int(self._fetches.item())

    @property
    def slots(self) -> dict[int, int]:
        """expert -> slot for the experts the slots hold now (reads the device)."""
        return {x: i for i, x in enumerate(self.slot_expert.tolist()) if x >= 0} if self.n_slots else {}

    def _write_tables(self) -> None:
        """Device tables from `row_of` / `host_row`; the slots emptied."""
        e = self.n_experts
        host_row, index = [-1] * e, [-1] * e
        for x, i in self.host_row.items():
            host_row[x] = i
        for x, i in self.row_of.items():
            index[x] = i
        self.host_row_of.copy_(torch.tensor(host_row))
        self.index.copy_(torch.tensor(index))
        self.slot_expert.fill_(-1)
        self.slot_stamp.fill_(-1)

    # ------------------------------------------------------------------ loading
    def dest(self, tensor: str, expert: int) -> torch.Tensor:
        """Where expert `expert`'s slice of `tensor` lives (device row or pinned host row)."""
        i = EXPERT_TENSORS.index(tensor)
        if expert in self.host_row:
            return self.host_tensors[i][self.host_row[expert]]
        return self.device_tensors[i][self.row_of[expert]]

    def device_bytes(self) -> tuple[int, int]:
        """(resident bytes, slot bytes) on the device."""
        per_row = sum(t[0].numel() * t.element_size() for t in self.device_tensors) if self.device_tensors[0].shape[0] else 0
        return per_row * len(self.row_of), per_row * self.n_slots

    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host_tensors)

    # ------------------------------------------------------------------ running
    def run(self, module, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
            add: torch.Tensor | None) -> torch.Tensor:
        if not self.host_row:
            return module.run(x, self.index[experts], weights, add, self.device_tensors)
        picks = experts.flatten()
        if self.prefetch_pending:  # its plan changed the cache state this plan reads
            self._wait()
            self.prefetch_pending = False
        r = len(self.row_of)
        chunks = -(-min(picks.numel(), len(self.host_row)) // self.n_slots)
        self.multi_chunk_steps += chunks > 1
        direct = SORT_FREE_PASSES and module.decodes_in_passes(x, experts, self.device_tensors)  # any chunks
        separate_resident = self.overlap and r > 0
        out = None
        # The resident pass's groups (each pick's resident row, R + S if offloaded), written by chunk
        # 0's plan: no launch of their own.
        resident_rows = torch.empty_like(picks) if separate_resident else None
        for chunk in range(chunks):
            mapped = expert_cache_plan(
                picks, self.host_row_of, self.index, self.slot_expert, self.slot_stamp, self.clock, self._fetches,
                self.counts, self.copy_count, self.copy_slot, self.copy_src, chunk=chunk, n_resident=r,
                with_resident=chunk == 0 and not separate_resident, count_picks=chunk == 0,
                resident_rows=resident_rows if chunk == 0 else None)
            self._fetch()
            if chunk == 0 and separate_resident:  # beside the copies of chunk 0
                out = self._pass(module, x, resident_rows.view_as(experts), out, direct)
            self._wait()
            out = self._pass(module, x, mapped.view_as(experts), out, direct)
        return moe_combine(out[1] if direct else out, None, weights, add, impl=module.impl)

    def prefetch(self, experts: torch.Tensor) -> None:
        """Plan and fetch, ahead of this layer's own step, the first S offloaded experts that
        `experts` (guessed picks [T, k]) name; nothing for steps of more than PREFETCH_MAX_PICKS
        picks. The guess is copied into a persistent buffer on the compute stream, so the side
        stream reads only memory that outlives it; `run` waits for the side stream first."""
        n = experts.numel()
        if not self.host_row or n > PREFETCH_MAX_PICKS:
            return
        picks = self.prefetch_picks[:n]
        picks.copy_(experts.reshape(-1))
        stream = self.copy_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream) if stream is not None else _nullcontext():
            expert_cache_plan(picks, self.host_row_of, self.index, self.slot_expert, self.slot_stamp, self.clock,
                              self._fetches, self.counts, self.copy_count, self.copy_slot, self.copy_src, chunk=0,
                              n_resident=len(self.row_of))
            for dev, host in zip(self.device_tensors, self.host_tensors):
                expert_fetch(host, dev, self.copy_count, self.copy_slot, self.copy_src, len(self.row_of))
        self.prefetch_pending = stream is not None

    def _pass(self, module, x: torch.Tensor, groups: torch.Tensor, out, direct: bool):
        """The step's expert outputs in pick order after one more pass over the picks whose group is
        a device row (< R + S; the others carry R + S). `direct`: (hidden, y) of the sort-free
        route, this pass's rows written in place and the others kept (`pass_outputs`). Else y
        [T*k, D] of the sorted route: this pass's rows for its picks, `out`'s for the others."""
        if direct:
            return module.pass_outputs(x, groups, self.device_tensors, out)
        n_rows = self.device_tensors[0].shape[0]
        y_sorted, pos = module.pick_outputs(x, groups, self.device_tensors, n_sort=n_rows + 1)
        part = y_sorted[pos]
        return part if out is None else torch.where((groups.reshape(-1) < n_rows)[:, None], part, out)

    def _fetch(self) -> None:
        """The copy list's rows host -> slots; on CUDA on the side stream, after what the compute
        stream has queued (the previous pass may still read the slots): `_wait` before reading."""
        stream = self.copy_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream) if stream is not None else _nullcontext():
            for dev, host in zip(self.device_tensors, self.host_tensors):
                expert_fetch(host, dev, self.copy_count, self.copy_slot, self.copy_src, len(self.row_of))

    def _wait(self) -> None:
        if self.copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)

    # ------------------------------------------------------------------ placement
    @torch.no_grad()
    def place_by_counts(self, counts: torch.Tensor | None = None) -> int:
        """Make the most picked experts resident (swap rows between device and host); returns the
        number of swaps. Empties the slots."""
        counts = (self.counts if counts is None else counts).cpu()
        r = len(self.row_of)
        hot = set(torch.argsort(counts, descending=True, stable=True)[:r].tolist())
        cold_resident = [x for x in self.resident if x not in hot]
        hot_host = [x for x in self.host_experts if x in hot]
        for cold, warm in zip(cold_resident, hot_host):
            row, hrow = self.row_of.pop(cold), self.host_row.pop(warm)
            for dev, host in zip(self.device_tensors, self.host_tensors):
                tmp = dev[row].to("cpu", copy=True)  # a copy also when the device is the CPU
                dev[row].copy_(host[hrow])
                host[hrow].copy_(tmp)
            self.row_of[warm], self.host_row[cold] = row, hrow
        self._write_tables()
        return len(hot_host)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
