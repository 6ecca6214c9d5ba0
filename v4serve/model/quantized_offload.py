"""Routed experts partly in host memory (`cpu_offload_gb`): one `ExpertOffload` per MoE layer.

Layout, per expert tensor t of the layer (EXPERT_TENSORS, leading dim = expert):

    device[t]  [R + S, ...]   rows 0..R-1: the R resident experts; rows R..R+S-1: S cache slots
    host[t]    [H, ...]       the H = E - R offloaded experts, pinned (on CUDA) host memory
    index      [E] int64, on the device: expert e -> its device row (resident row, or R + slot
               while a slot holds it), -1 while it is only on the host

A step's picks are remapped through `index` and run over `device[t]` by the experts' own `run`
(the grouped matmul never sees the host). Before that, the offloaded experts the step picks are
made present: the step's distinct experts are read on the host (one synchronisation per
offloaded layer: an offloaded model runs its decode eagerly, without CUDA graphs), the missing
ones copied host -> slot on a side copy stream, evicting the least recently used slots the step
does not need. On CUDA (`overlap`) the resident experts' picks run in a pass of their own while
those copies are in flight; the offloaded picks run once the compute stream has waited for the
copy stream. A step that needs more offloaded experts than there are slots (a long prefill) runs
in more passes of at most S offloaded experts. Each pass computes the expert outputs of its
experts' picks (the other picks are sorted past the last group and computed by no group, so they
read no weights, never a slot being written); every pick keeps its output from its expert's pass,
and one combine sums each token's picks. The result is bit-identical to the model with every
expert resident (`MXFP4Experts.pick_outputs` says why): a split step is exact, not a sum of
per-pass partial combines (which would round each pass to the model dtype and add the rounded
parts in another order).
Overlap with the EARLIER layers is not done: the routing of a layer is known only when it runs.

`counts` [E] (host, int64) counts every pick: `place_by_counts` moves the most used experts into
the resident rows (placement by measured use).
"""

from __future__ import annotations

from collections import OrderedDict

import torch

from v4serve.model.quantized import EXPERT_TENSORS
from v4serve.ops.moe_combine import moe_combine


class ExpertOffload:
    def __init__(self, module: torch.nn.Module, host_experts: list[int], n_slots: int, device: torch.device):
        shapes = {n: tuple(getattr(module, n).shape) for n in EXPERT_TENSORS}
        dtypes = {n: getattr(module, n).dtype for n in EXPERT_TENSORS}
        self.n_experts = e = shapes[EXPERT_TENSORS[0]][0]
        self.host_experts = sorted(host_experts)
        if len(set(self.host_experts)) != len(self.host_experts) or not all(0 <= x < e for x in self.host_experts):
            raise ValueError(f"host experts must be distinct ids in [0, {e}), got {host_experts}")
        host = set(self.host_experts)
        self.resident = [x for x in range(e) if x not in host]
        self.n_slots = n_slots if self.host_experts else 0
        if self.host_experts and n_slots < 1:
            raise ValueError("an offloaded layer needs at least one device slot")
        r, s, h = len(self.resident), self.n_slots, len(self.host_experts)
        pin = device.type == "cuda"
        self.device = device
        self.device_tensors = [torch.empty((r + s, *shapes[n][1:]), dtype=dtypes[n], device=device) for n in EXPERT_TENSORS]
        self.host_tensors = [torch.empty((h, *shapes[n][1:]), dtype=dtypes[n], pin_memory=pin) for n in EXPERT_TENSORS]
        self.row_of = {x: i for i, x in enumerate(self.resident)}  # resident expert -> device row
        self.host_row = {x: i for i, x in enumerate(self.host_experts)}  # offloaded expert -> host row
        self.slots: OrderedDict[int, int] = OrderedDict()  # expert -> slot, least recently used first
        self.index = torch.full((e,), -1, dtype=torch.long, device=device)
        if self.resident:
            self.index[torch.tensor(self.resident, device=device)] = torch.arange(r, device=device)
        self.counts = torch.zeros(e, dtype=torch.long)
        self.fetches = 0  # host -> slot copies
        self.split_steps = 0  # steps that needed more offloaded experts than slots (run in rounds)
        self.copy_stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        # Resident experts computed in a pass of their own while the copies run (CUDA: the copy
        # engine works beside the SMs); on the CPU nothing runs beside, so one pass fewer.
        self.overlap = device.type == "cuda"

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
        return per_row * len(self.resident), per_row * self.n_slots

    def host_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.host_tensors)

    # ------------------------------------------------------------------ running
    def run(self, module, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
            add: torch.Tensor | None) -> torch.Tensor:
        used, n = experts.flatten().unique(return_counts=True)  # the one host synchronisation
        used_list = used.tolist()
        self.counts[used_list] += n.cpu()
        offloaded = [x for x in used_list if x in self.host_row]
        chunks = [offloaded[i:i + self.n_slots] for i in range(0, len(offloaded), self.n_slots)]
        self.split_steps += len(chunks) > 1
        if not chunks:  # every pick resident: one pass
            return module.run(x, self.index[experts], weights, add, self.device_tensors)
        # Passes: (experts whose picks it computes, the chunk it needs in the slots).
        if self.overlap and self.resident:  # the resident pass runs while the first chunk is copied
            passes = [(self.resident, None)] + [(c, c) for c in chunks]
            self._fetch(chunks[0])
        else:
            passes = [(self.resident + chunks[0], chunks[0])] + [(c, c) for c in chunks[1:]]
        # Every pass computes the expert outputs of its members' picks (the other picks get the
        # group id past the last row: sorted last, computed by no group, reading no weights, so
        # never a slot being written); each pick's output is kept from the pass of its expert, in
        # pick order; one combine at the end. So the bits are those of one pass with every expert
        # resident: same groups (a pick's group holds the same picks, in the same order), same
        # tiles (`pick_outputs`), same fp32 sum over a token's picks, the shared expert added once.
        n_rows = self.device_tensors[0].shape[0]  # R + S: group id n_rows = "not in this pass"
        y = None
        for k, (members, chunk) in enumerate(passes):
            if chunk is not None:
                if not (self.overlap and self.resident and k == 1):
                    self._fetch(chunk)
                self._wait()
            mine = torch.zeros(self.n_experts, dtype=torch.bool, device=self.device)
            mine[torch.tensor(members, dtype=torch.long, device=self.device)] = True
            picked = mine[experts]
            mapped = torch.where(picked, self.index[experts], n_rows)
            y_sorted, pos = module.pick_outputs(x, mapped, self.device_tensors, n_sort=n_rows + 1)
            part = y_sorted[pos]  # pick order
            y = part if y is None else torch.where(picked.reshape(-1, 1), part, y)
        identity = torch.arange(y.shape[0], device=y.device)
        return moe_combine(y, identity, weights, add, impl=module.impl)

    def _fetch(self, group: list[int]) -> None:
        """Issue the copies that put every expert of `group` in a slot (on the copy stream on CUDA:
        `_wait` before reading them), evicting the least recently used experts not in `group`."""
        missing = [x for x in group if x not in self.slots]
        for x in group:
            if x in self.slots:
                self.slots.move_to_end(x)
        free = sorted(set(range(self.n_slots)) - set(self.slots.values()))
        wanted = set(group)
        stream = self.copy_stream
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(self.device))  # slots may still be read
        for x in missing:
            if free:
                slot = free.pop(0)
            else:
                victim = next(v for v in self.slots if v not in wanted)
                slot = self.slots.pop(victim)
                self.index[victim] = -1
            row = len(self.resident) + slot
            with torch.cuda.stream(stream) if stream is not None else _nullcontext():
                for dev, host in zip(self.device_tensors, self.host_tensors):
                    dev[row].copy_(host[self.host_row[x]], non_blocking=True)
            self.slots[x] = slot
            self.index[x] = row
            self.fetches += 1

    def _wait(self) -> None:
        if self.copy_stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.copy_stream)

    # ------------------------------------------------------------------ placement
    @torch.no_grad()
    def place_by_counts(self, counts: torch.Tensor | None = None) -> int:
        """Make the most picked experts resident (swap rows between device and host); returns the
        number of swaps. Empties the slots."""
        counts = self.counts if counts is None else counts
        for x in list(self.slots):
            self.index[x] = -1
        self.slots.clear()
        r = len(self.resident)
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
            self.index[warm], self.index[cold] = row, -1
        self.resident = sorted(self.row_of, key=self.row_of.get)
        self.host_experts = sorted(self.host_row, key=self.host_row.get)
        return len(hot_host)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
