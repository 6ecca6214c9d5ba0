"""Speculative decode steps of sequences that are all decoding, addressed on the device and, on
CUDA, replayed as captured CUDA graphs (the eager path of `engine/speculative.py` handles steps
that also prefill).

A step of S sequences, each with its last token t and k drafts d_1..d_k, is two graphs:

1. **verify**: the target over the S (k + 1) tokens at positions start .. start + k
   (`PagedKVCache.build_verify_batch`: group-major rows, through the decode kernels), saving
   every compressor state after each group (`cache/state_checkpoints.py`); then on the device the
   target's greedy token at every row (`best` [S, k + 1]), its logprob, and the greedy acceptance
   (`accepted` [S]: the longest prefix of drafts equal to `best`).
2. **commit + draft**: each sequence's compressor states set to those after its accepted prefix;
   then the MTP layer (when it drafts) over the same k + 1 positions, fed the target's final
   streams and the tokens that follow them (`best`: the accepted drafts, then the target's own
   token at the first rejection): every row writes its KV, and the row at the last kept position
   alone goes on through the MoE and the head to draft the next token; k - 1 decode steps of the
   MTP layer on its own output streams draft the rest (`drafts` [S, k]).

Between the two, `accepted` is either the device's greedy count (no host value needed: both
graphs are queued back to back and the step reads its results once) or the host's answer after
rejection sampling (`commit_and_draft(accepted)`). Rows written past the kept prefix need no undo (rings of
W + k rows; see state_checkpoints.py). A step of n < S sequences replays the smallest graph with
room, its extra rows on the cache's padding slot and routed in the MoE as live rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from v4serve.cache import PagedKVCache
from v4serve.cache.state_checkpoints import StateCheckpoints
from v4serve.engine.decode_runner import batch_size_ladder
from v4serve.engine.graph_capture import capture_graph, capture_ladder


def verify_route_rows(n: int, size: int, groups: int) -> list[int]:
    """MoE routing row of each group-major token of a verify step of `size` rows, `n` live: live
    tokens route as themselves, a padding row's token as a live row's token of the same group."""
    return [g * size + (b if b < n else b % n) for g in range(groups) for b in range(size)]


def greedy_acceptance(tokens: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """[S] int64: for rows [t, d_1..d_k] (`tokens` [S, k + 1]) and the target's greedy tokens
    `best` [S, k + 1] after each, the drafts accepted: the longest prefix with d_{i+1} == best_i."""
    match = (tokens[:, 1:] == best[:, :-1]).to(torch.int64)
    return match.cumprod(dim=1).sum(dim=1)


@dataclass
class VerifyOutputs:
    """One verify graph's outputs (views of its static tensors, valid until its next replay)."""

    logits: torch.Tensor  # [S, k + 1, V] fp32 (a strided view of the group-major rows)
    best: torch.Tensor  # [S, k + 1] int64 the target's greedy token after each row
    best_logprob: torch.Tensor  # [S, k + 1] fp32 its logprob
    accepted: torch.Tensor  # [S] int64 greedy acceptance
    streams: torch.Tensor  # [(k + 1) S, hc, D] the target's final streams, group-major


class VerifyRunner:
    def __init__(self, model, cache: PagedKVCache, draft_cache: PagedKVCache | None, k: int, max_batch: int,
                 use_cuda_graphs: bool, graph_sizes: tuple[int, ...] | None = None):
        """`draft_cache`: the MTP layer's own cache (None: the drafts come from elsewhere and the
        second graph only commits)."""
        self.model, self.cache, self.draft_cache = model, cache, draft_cache
        self.k, self.groups, self.max_batch = k, k + 1, max_batch
        self.ladder = batch_size_ladder(max_batch, graph_sizes)
        device = cache.device
        self.checkpoints = StateCheckpoints(cache._states, self.groups, max_batch)
        self._tokens = torch.zeros(max_batch, self.groups, dtype=torch.int64, device=device)
        self._starts = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self._slots = torch.full((max_batch,), cache.padding_slot, dtype=torch.int64, device=device)
        self._route_rows = torch.arange(max_batch * self.groups, dtype=torch.int64, device=device)
        self._accepted = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self._draft_slots = None if draft_cache is None else torch.full(
            (max_batch,), draft_cache.padding_slot, dtype=torch.int64, device=device)
        # Host staging of a step's rows [tokens (k + 1) | start | slot | draft slot | route rows
        # (k + 1)], pinned so the copy is asynchronous, doubled: a step is written while the
        # previous one may still be copying.
        pinned = device.type == "cuda"
        self._staging = [torch.zeros(max_batch, 2 * self.groups + 3, dtype=torch.int64, pin_memory=pinned)
                         for _ in range(2)]
        self._accepted_staging = [torch.zeros(max_batch, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self._step = 0
        self._size = 0  # rows of the step in flight (the graph size it uses)
        self._outputs: VerifyOutputs | None = None
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, VerifyOutputs, torch.cuda.CUDAGraph, torch.Tensor | None]] = (
            capture_ladder(self.ladder, self._capture_size, "speculative steps") if use_cuda_graphs else {})

    @property
    def uses_cuda_graphs(self) -> bool:
        return bool(self._graphs)

    # ------------------------------------------------------------------ the two halves of a step
    def _verify(self, size: int) -> VerifyOutputs:
        g = self.groups
        tokens = self._tokens[:size]
        self.checkpoints.begin(self._slots[:size])
        batch = self.cache.build_verify_batch(
            tokens.t().reshape(-1), self._starts[:size], self._slots[:size], g,
            route_rows=self._route_rows[:size * g] if size * g > 1 else None, checkpoints=self.checkpoints)
        logits, streams = self.model.forward_with_streams(batch, self.cache)
        top, best = logits.max(dim=-1)
        best_logprob = top - torch.logsumexp(logits, dim=-1)
        per_row = lambda t: t.view(g, size, *t.shape[1:]).transpose(0, 1)  # noqa: E731 group-major -> [S, k+1]
        best = per_row(best)
        return VerifyOutputs(per_row(logits), best, per_row(best_logprob), greedy_acceptance(tokens, best), streams)

    def _commit_and_draft(self, size: int, outputs: VerifyOutputs) -> torch.Tensor | None:
        accepted = self._accepted[:size]
        self.checkpoints.commit(accepted)
        if self.draft_cache is None:
            return None
        g, model, cache = self.groups, self.model, self.draft_cache
        starts, draft_slots = self._starts[:size], self._draft_slots[:size]
        # The MTP layer at position start + j reads the target's streams there and the token after
        # it: best[:, j] (an accepted draft, or the target's own token at the first rejection).
        batch = cache.build_verify_batch(outputs.best.t().reshape(-1), starts, draft_slots, g,
                                         route_rows=self._route_rows[:size * g] if size * g > 1 else None)
        # Only the row at each sequence's last kept position drafts: the other rows write their KV
        # rows (attention) and skip the MoE and the head.
        kept = accepted * size + torch.arange(size, device=accepted.device)
        route = self._route_rows[:size] if size > 1 else None  # group 0's rows: b, or a live row for padding
        logits, streams = model.forward_mtp(outputs.streams, batch, cache, keep=(kept, route))
        draft = logits.argmax(dim=-1)
        drafts = [draft]
        for i in range(1, self.k):
            step = cache.build_decode_batch(draft, starts + accepted + i, draft_slots, route_rows=route)
            logits, streams = model.forward_mtp(streams, step, cache)
            draft = logits.argmax(dim=-1)
            drafts.append(draft)
        return torch.stack(drafts, dim=1)

    def _capture_size(self, size: int, pool):
        """(verify graph, its outputs, commit + draft graph, its drafts) for `size` rows."""
        verify, outputs = capture_graph(lambda: self._verify(size), pool)
        verify.replay()  # a capture runs nothing: the second half's warm-up reads real outputs
        after, drafts = capture_graph(lambda: self._commit_and_draft(size, outputs), pool)
        return verify, outputs, after, drafts

    # ------------------------------------------------------------------ a step
    @torch.inference_mode()
    def verify(self, tokens: list[list[int]], starts: list[int], slots: list[int],
               draft_slots: list[int] | None = None) -> VerifyOutputs:
        """Launch the verify half for n sequences: `tokens[b]` = [last token, k drafts] at positions
        starts[b] .. starts[b] + k of cache slot slots[b] (and `draft_slots[b]` of the draft's
        cache). Returns the outputs' first n rows; nothing waits for the GPU."""
        n = len(slots)
        if n > self.max_batch or any(len(t) != self.groups for t in tokens):
            raise ValueError(f"a verify step takes <= {self.max_batch} sequences of {self.groups} tokens each")
        size = next((s for s in self.ladder if s >= n and s in self._graphs), n)
        pad, g = size - n, self.groups
        draft_pad = self.draft_cache.padding_slot if self.draft_cache is not None else 0
        rows = [[*t, s, slot, d] for t, s, slot, d in zip(tokens, starts, slots, draft_slots or slots)]
        rows += [[0] * g + [0, self.cache.padding_slot, draft_pad]] * pad
        staging = self._staging[self._step % 2]
        self._step += 1
        staging[:size, :g + 3] = torch.tensor(rows, dtype=torch.int64)
        # the MoE routing row of each group-major token, laid out [b, group] here
        staging[:size, g + 3:] = torch.tensor(verify_route_rows(n, size, g), dtype=torch.int64).view(g, size).t()
        staged = staging[:size].to(self._tokens.device, non_blocking=True)
        self._tokens[:size].copy_(staged[:, :g])
        self._starts[:size].copy_(staged[:, g])
        self._slots[:size].copy_(staged[:, g + 1])
        if self._draft_slots is not None:
            self._draft_slots[:size].copy_(staged[:, g + 2])
        self._route_rows[:size * g].view(g, size).copy_(staged[:, g + 3:].t())
        self._size = size
        if size in self._graphs:
            graph, outputs, _, _ = self._graphs[size]
            graph.replay()
        else:
            outputs = self._verify(size)
        self._outputs = outputs
        return VerifyOutputs(outputs.logits[:n], outputs.best[:n], outputs.best_logprob[:n], outputs.accepted[:n],
                             outputs.streams)

    @torch.inference_mode()
    def commit_and_draft(self, accepted: list[int] | None = None) -> torch.Tensor | None:
        """Launch the second half of the step in flight: `accepted` per sequence (None: the
        device's greedy count). Returns the drafts [n, k] on the device (None without a draft)."""
        size, outputs = self._size, self._outputs
        if outputs is None:
            raise RuntimeError("commit_and_draft without a verify step in flight")
        if accepted is None:
            self._accepted[:size].copy_(outputs.accepted)
        else:
            n = len(accepted)
            if any(not 0 <= a <= self.k for a in accepted):
                raise ValueError(f"accepted counts must be in [0, {self.k}], got {accepted}")
            staging = self._accepted_staging[self._step % 2]
            staging[:size] = torch.tensor(accepted + [0] * (size - n), dtype=torch.int64)
            self._accepted[:size].copy_(staging[:size], non_blocking=True)
        self._outputs = None
        if size in self._graphs:
            _, _, graph, drafts = self._graphs[size]
            graph.replay()
        else:
            drafts = self._commit_and_draft(size, outputs)
        return drafts
