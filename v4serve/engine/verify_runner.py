"""Speculative decode steps of sequences that are all decoding, addressed on the device and, on
CUDA, replayed as captured CUDA graphs (the eager path of `engine/speculative.py` handles steps
that also prefill).

A step of S sequences, each with its last token t and k drafts d_1..d_k, is two graphs:

1. **verify**: the target over the S (k + 1) tokens at positions start .. start + k
   (`PagedKVCache.build_verify_batch`: group-major rows, through the decode kernels), journaling,
   before each group, the compressor sub-rows it overwrites (an undo log, `cache/state_checkpoints.py`);
   then on the device the target's greedy token at every row (`best` [S, k + 1]), its logprob, and
   the greedy acceptance (`accepted` [S]: the longest prefix of drafts equal to `best`).
2. **commit + draft**: each sequence's compressor states set back to those after its accepted prefix
   (the journal's entries of the rejected groups undone, last first);
   then the MTP layer (when it drafts) over the same k + 1 positions, fed the target's final
   streams and the tokens that follow them (`best`: the accepted drafts, then the target's own
   token at the first rejection): every row writes its KV, and the row at the last kept position
   alone goes on through the MoE and the head to draft the next token; k - 1 decode steps of the
   MTP layer on its own output streams draft the rest (`drafts` [S, k]).

Between the two, `accepted` is either the device's greedy count, capped per sequence at the
drafts it may keep (`caps`: fewer near max_tokens, or drafts padded to k; no host value needed:
both graphs are queued back to back), or the host's answer after rejection sampling
(`commit_and_draft(accepted)`). The second graph ends by packing what the host needs into one
float64 row per sequence (`ResultColumns`: the target's tokens, the accepted count, their
logprobs, the new drafts; token ids and fp32 logprobs are exact in float64), and the step reads
that block with one copy into pinned memory: one device->host synchronisation per step. The next
step of the same sequences can be launched from that block on the device before the host reads
it (`continue_verify`: the engine's continuations). Rows written past the kept prefix need no
undo (rings of W + k rows; see state_checkpoints.py). A step of n < S sequences replays the
smallest graph with room, its extra rows on the cache's padding slot and routed in the MoE as live
rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from v4serve.cache import PagedKVCache
from v4serve.cache.state_checkpoints import StateCheckpoints
from v4serve.engine.decode_runner import batch_size_ladder
from v4serve.engine.graph_capture import capture_graph, capture_ladder


NO_LIMIT = 2**62  # the room of a sequence without max_tokens


def verify_route_rows(n: int, size: int, groups: int) -> list[int]:
    """MoE routing row of each group-major token of a verify step of `size` rows, `n` live: live
    tokens route as themselves, a padding row's token as a live row's token of the same group."""
    return [g * size + (b if b < n else b % n) for g in range(groups) for b in range(size)]


def greedy_acceptance(tokens: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """[S] int64: for rows [t, d_1..d_k] (`tokens` [S, k + 1]) and the target's greedy tokens
    `best` [S, k + 1] after each, the drafts accepted: the longest prefix with d_{i+1} == best_i."""
    match = (tokens[:, 1:] == best[:, :-1]).to(torch.int64)
    return match.cumprod(dim=1).sum(dim=1)


@dataclass(frozen=True)
class ResultColumns:
    """Column layout of a step's packed results [S, width] (float64): best [k + 1] | accepted [1] |
    best logprob [k + 1] | drafts [k] (absent without a draft cache)."""

    k: int
    drafts: bool

    @property
    def width(self) -> int:
        return 2 * (self.k + 1) + 1 + (self.k if self.drafts else 0)

    def split(self, row: list[float]) -> tuple[list[int], int, list[float], list[int]]:
        """(best tokens, accepted count, best logprobs, drafts) of one host row."""
        g = self.k + 1
        return ([int(t) for t in row[:g]], int(row[g]), row[g + 1:2 * g + 1],
                [int(t) for t in row[2 * g + 1:]])


@dataclass
class StepResults:
    """A launched step's packed results on their way to the host: `host` (pinned on CUDA) is
    filled by one asynchronous copy; `read()` waits for it (the step's one synchronisation)."""

    columns: ResultColumns
    host: torch.Tensor  # [n, width] float64
    done: "torch.cuda.Event | None"

    def read(self) -> list[tuple[list[int], int, list[float], list[int]]]:
        if self.done is not None:
            self.done.synchronize()
        return [self.columns.split(row) for row in self.host.tolist()]


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
        self._caps = torch.zeros(max_batch, dtype=torch.int64, device=device)
        self._room = torch.zeros(max_batch, dtype=torch.int64, device=device)  # drafts max_tokens leaves room for
        self.columns = ResultColumns(k, draft_cache is not None)
        self._draft_slots = None if draft_cache is None else torch.full(
            (max_batch,), draft_cache.padding_slot, dtype=torch.int64, device=device)
        # Host staging of a step's rows [tokens (k + 1) | start | slot | draft slot | cap | room |
        # route rows (k + 1)], pinned so the copy is asynchronous, doubled: a step is written while
        # the previous one may still be copying. Results come back the same way.
        pinned = device.type == "cuda"
        self._staging = [torch.zeros(max_batch, 2 * self.groups + 5, dtype=torch.int64, pin_memory=pinned)
                         for _ in range(2)]
        self._accepted_staging = [torch.zeros(max_batch, dtype=torch.int64, pin_memory=pinned) for _ in range(2)]
        self._results_host = [torch.zeros(max_batch, self.columns.width, dtype=torch.float64, pin_memory=pinned)
                              for _ in range(2)]
        self._n = 0  # live rows of the step in flight
        self._last: tuple[VerifyOutputs, torch.Tensor] | None = None  # the last step's outputs and results
        self._step = 0
        self._size = 0  # rows of the step in flight (the graph size it uses)
        self._outputs: VerifyOutputs | None = None
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, VerifyOutputs, torch.cuda.CUDAGraph, torch.Tensor]] = (
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
        accepted = torch.minimum(greedy_acceptance(tokens, best), self._caps[:size])
        return VerifyOutputs(per_row(logits), best, per_row(best_logprob), accepted, streams)

    def _commit_and_draft(self, size: int, outputs: VerifyOutputs) -> torch.Tensor:
        """The second half; returns the packed results [size, columns.width] float64."""
        accepted = self._accepted[:size]
        self.checkpoints.commit(accepted)
        head = (outputs.best.double(), accepted[:, None].double(), outputs.best_logprob.double())
        if self.draft_cache is None:
            return torch.cat(head, dim=1)
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
        return torch.cat((*head, torch.stack(drafts, dim=1).double()), dim=1)

    def _capture_size(self, size: int, pool):
        """(verify graph, its outputs, commit + draft graph, its packed results) for `size` rows."""
        verify, outputs = capture_graph(lambda: self._verify(size), pool)
        verify.replay()  # a capture runs nothing: the second half's warm-up reads real outputs
        after, results = capture_graph(lambda: self._commit_and_draft(size, outputs), pool)
        return verify, outputs, after, results

    # ------------------------------------------------------------------ a step
    @torch.inference_mode()
    def verify(self, tokens: list[list[int]], starts: list[int], slots: list[int],
               caps: list[int] | None = None, rooms: list[int] | None = None,
               draft_slots: list[int] | None = None) -> VerifyOutputs:
        """Launch the verify half for n sequences: `tokens[b]` = [last token, k drafts] at positions
        starts[b] .. starts[b] + k of cache slot slots[b] (and `draft_slots[b]` of the draft's
        cache); the device's greedy acceptance keeps at most `caps[b]` drafts (None: k; drafts
        past the cap are padding); `rooms[b]` (None: no limit) the drafts max_tokens leaves room
        for, which a continuation's caps follow. Returns the outputs' first n rows; nothing waits
        for the GPU."""
        n, k = len(slots), self.k
        if n > self.max_batch or any(len(t) != self.groups for t in tokens):
            raise ValueError(f"a verify step takes <= {self.max_batch} sequences of {self.groups} tokens each")
        caps = [k] * n if caps is None else caps
        if len(caps) != n or any(not 0 <= c <= k for c in caps):
            raise ValueError(f"caps must give each of the {n} sequences a count in [0, {k}], got {caps}")
        size = next((s for s in self.ladder if s >= n and s in self._graphs), n)
        pad, g = size - n, self.groups
        draft_pad = self.draft_cache.padding_slot if self.draft_cache is not None else 0
        rooms = [NO_LIMIT] * n if rooms is None else rooms
        rows = [[*t, s, slot, d, c, room] for t, s, slot, d, c, room in zip(
            tokens, starts, slots, draft_slots or slots, caps, rooms)]
        rows += [[0] * g + [0, self.cache.padding_slot, draft_pad, 0, 0]] * pad
        staging = self._staging[self._step % 2]
        self._step += 1
        staging[:size, :g + 5] = torch.tensor(rows, dtype=torch.int64)
        # the MoE routing row of each group-major token, laid out [b, group] here
        staging[:size, g + 5:] = torch.tensor(verify_route_rows(n, size, g), dtype=torch.int64).view(g, size).t()
        staged = staging[:size].to(self._tokens.device, non_blocking=True)
        self._tokens[:size].copy_(staged[:, :g])
        self._starts[:size].copy_(staged[:, g])
        self._slots[:size].copy_(staged[:, g + 1])
        if self._draft_slots is not None:
            self._draft_slots[:size].copy_(staged[:, g + 2])
        self._caps[:size].copy_(staged[:, g + 3])
        self._room[:size].copy_(staged[:, g + 4])
        self._route_rows[:size * g].view(g, size).copy_(staged[:, g + 5:].t())
        self._size, self._n = size, n
        return self._replay_verify()

    @torch.inference_mode()
    def continue_verify(self, draft_filter=None) -> VerifyOutputs:
        """Launch the verify half of the next step of the same sequences from the last step's
        results on the device, without the host: each sequence's last token is the target's token
        after its accepted drafts, its drafts the MTP draft's (through `draft_filter(drafts [n, k],
        starts [n])` when given, on the device), its start moves by accepted + 1, its cap follows
        its room. A sequence that ended meanwhile (stop, EOS, max_tokens) computes a row the host
        drops."""
        if self._last is None or not self.columns.drafts:
            raise RuntimeError("continue_verify needs a finished step with MTP drafts")
        (outputs, results), n, g = self._last, self._n, self.groups
        accepted = self._accepted[:n]
        drafts = results[:n, 2 * g + 1:].to(torch.int64)
        starts = self._starts[:n] + accepted + 1
        if draft_filter is not None:
            drafts = draft_filter(drafts, starts)
        self._tokens[:n, 1:].copy_(drafts)
        self._tokens[:n, 0].copy_(outputs.best[:n].gather(1, accepted[:, None])[:, 0])
        self._starts[:n].copy_(starts)
        self._room[:n].sub_(accepted + 1)
        self._caps[:n].copy_(self._room[:n].clamp(0, self.k))
        self._step += 1
        return self._replay_verify()

    def _replay_verify(self) -> VerifyOutputs:
        size, n = self._size, self._n
        if size in self._graphs:
            graph, outputs, _, _ = self._graphs[size]
            graph.replay()
        else:
            outputs = self._verify(size)
        self._outputs = outputs
        return VerifyOutputs(outputs.logits[:n], outputs.best[:n], outputs.best_logprob[:n], outputs.accepted[:n],
                             outputs.streams)

    @torch.inference_mode()
    def commit_and_draft(self, accepted: list[int] | None = None) -> StepResults:
        """Launch the second half of the step in flight, `accepted` per sequence (None: the
        device's greedy count), and the copy of its packed results to the host."""
        size, n, outputs = self._size, self._n, self._outputs
        if outputs is None:
            raise RuntimeError("commit_and_draft without a verify step in flight")
        if accepted is None:
            self._accepted[:size].copy_(outputs.accepted)
        else:
            if len(accepted) != n or any(not 0 <= a <= self.k for a in accepted):
                raise ValueError(f"accepted counts must be {n} values in [0, {self.k}], got {accepted}")
            staging = self._accepted_staging[self._step % 2]
            staging[:size] = torch.tensor(accepted + [0] * (size - n), dtype=torch.int64)
            self._accepted[:size].copy_(staging[:size], non_blocking=True)
        self._outputs = None
        if size in self._graphs:
            _, _, graph, results = self._graphs[size]
            graph.replay()
        else:
            results = self._commit_and_draft(size, outputs)
        self._last = (outputs, results)
        host = self._results_host[self._step % 2][:n]
        host.copy_(results[:n], non_blocking=True)
        done = None
        if host.is_pinned():
            done = torch.cuda.Event()
            done.record()
        return StepResults(self.columns, host, done)
