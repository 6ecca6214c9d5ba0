"""Speculative decoding: a draft proposes k tokens per sequence, one target step verifies them.

`SpeculativeStepper.step()` replaces the engine's step when `speculative_config` is set
(`engine/spec_config.py`); the draft is `engine/mtp_drafter.py`'s, the acceptance rules
`engine/spec_decode.py`'s, the counters `engine/spec_metrics.py`'s.

A step in which every scheduled sequence decodes (the steady state) runs on the device
(`engine/verify_runner.py`, two CUDA graphs on CUDA): verify, acceptance (on the device when
every request is greedy, capped per sequence where fewer than k drafts may be kept: near
max_tokens, or a draft that gave fewer; the drafts are padded to k), rollback by undoing the
rejected groups' compressor writes from a journal (`cache/state_checkpoints.py`; window rings of
W + k rows need none) and the MTP
draft, with one read of the packed results per step. When every request is greedy, without
logprobs, drafted by the MTP graph, and nothing waits, a step is left in flight and the next call
launches its successor from its results on the device (a continuation, as the plain engine's
decode steps do) before reading them: the host's bookkeeping then overlaps the GPU. Any other step
(prefill chunks, a sequence within k of max_model_len, pages short) is the eager step below:

1. Schedule as usual. A decode chunk (one token at position p, the sequence's last) is extended by
   the sequence's drafts d_1..d_k (fewer near max_model_len / max_tokens, none when pages run
   short): tokens [t_p, d_1..d_k] at positions p..p+k. Prefill chunks stay as they are. All chunks
   go through one prefill-style target forward (rows of several tokens per sequence; eager, no
   CUDA graph), logits at every row of a verify chunk.
2. Accept (`spec_decode.py`): greedy prefix matching or rejection sampling; a + 1 tokens emitted.
3. Roll back (`cache/rollback.py`): a sequence that rejected drafts gets its snapshot restored
   (taken before the forward) and its accepted tokens p..p+a replayed, all such sequences in one
   more forward: the cache then holds exactly what a step of only those tokens writes. A
   sequence that accepted every draft keeps what the verify step wrote.
4. Emit the tokens one at a time through the engine's bookkeeping (stop strings, EOS, max_tokens
   end the sequence mid-list; the rest are dropped).
5. Draft (`Drafter.propose`): the draft sees each chunk's committed positions with the target's
   final streams there, and proposes the next k tokens of every sequence that is decoding.

Exactness of the output does not depend on the draft: a wrong draft only costs a rejection.
Metrics follow vLLM's spec-decode counters (`SpecDecodeMetrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from v4serve.cache import OutOfPages, SequenceChunk
from v4serve.cache.rollback import SlotSnapshot
from v4serve.engine.mtp_drafter import Drafter, DraftItem, MTPDrafter
from v4serve.engine.outputs import RequestOutput
from v4serve.engine.request import Request, Status
from v4serve.engine.request_output import request_output
from v4serve.engine.scheduler import ScheduledChunk
from v4serve.engine.spec_config import SpeculativeConfig
from v4serve.engine.spec_decode import accept_greedy, accept_sampled, generator_of, greedy_tokens, processed_probs
from v4serve.engine.spec_metrics import SpecDecodeMetrics
from v4serve.engine.verify_runner import NO_LIMIT


def _tokens_left(request: Request) -> int:
    """Tokens `request` may still emit under max_tokens (set)."""
    return request.params.max_tokens - len(request.output_token_ids)


@dataclass
class GraphStepInFlight:
    """A launched device step: its requests, each row's start, cap (None for a continuation: known
    once the previous step is read), outputs, packed results on their way to the host, and the
    host's emitted tokens when it accepted (rejection sampling)."""

    requests: list[Request]
    starts: list[int] | None
    caps: list[int] | None
    out: Any
    results: Any
    emitted: list[list[int]] | None = None


class SpeculativeStepper:
    def __init__(self, engine, config: SpeculativeConfig, drafter: Drafter | None = None, overlap: bool = True):
        if engine.config.v41 is not None:
            raise ValueError("speculative decoding: DeepSeek-V4.1's DSpark draft is not supported")
        from v4serve.engine.verify_runner import VerifyRunner

        self.engine = engine
        self.k = config.num_speculative_tokens
        self.mtp = MTPDrafter(engine.runner.model, engine.cache) if drafter is None else None
        self.drafter: Drafter = drafter if drafter is not None else self.mtp
        self.metrics = SpecDecodeMetrics()
        self._drafts: dict[str, tuple[list[int], torch.Tensor | None]] = {}
        # Steps where every sequence decodes with k drafts: device-addressed, CUDA graphs on CUDA.
        runner = engine.runner
        self.verify_runner = VerifyRunner(
            runner.model, engine.cache, None if self.mtp is None else self.mtp.cache, self.k,
            engine.cache.max_seqs, runner.graphs_wanted, runner.graph_sizes)
        # A bench-only hook (`bench/forced_draft.py`): (request, drafts) -> the drafts to use.
        self.draft_filter = None
        self.device_steps = 0  # steps taken by the verify runner
        self.eager_steps = 0  # steps that ran the eager path (prefill chunks, max_model_len near)
        self.continuations = 0  # device steps launched from their predecessor's results on the device
        self.overlap = overlap
        self._in_flight: GraphStepInFlight | None = None

    def set_num_speculative_tokens(self, k: int) -> None:
        """Draft k tokens per step from now on (the benchmark compares k on one engine): at most
        the k the cache's window rings were built for. Drafts already made are cut to k."""
        room = self.engine.cache.ring_size - self.engine.cache.page_size
        if self._in_flight is not None:
            raise RuntimeError("set_num_speculative_tokens while a step is in flight")
        if not 1 <= k <= room:
            raise ValueError(f"num_speculative_tokens must be in [1, {room}] on this engine, got {k}")
        from v4serve.engine.verify_runner import VerifyRunner

        old = self.verify_runner
        self.k = k
        self.verify_runner = VerifyRunner(old.model, old.cache, old.draft_cache, k, old.max_batch,
                                          old.uses_cuda_graphs, tuple(old.ladder))
        self._drafts = {rid: (d[:k], None if p is None else p[:k]) for rid, (d, p) in self._drafts.items()}

    def _is_decode(self, chunk: ScheduledChunk) -> bool:
        r = chunk.request
        return chunk.length == 1 and chunk.end == r.num_tokens and r.num_tokens > len(r.prompt_token_ids)

    def _drafts_for(self, chunk: ScheduledChunk) -> tuple[list[int], torch.Tensor | None]:
        r = chunk.request
        drafts, probs = self._drafts.pop(r.request_id, ([], None))
        # positions fed stay < max_model_len
        drafts = drafts[:max(0, min(self.engine.max_model_len - 1 - chunk.start, self._keepable(r)))]
        if drafts:
            try:
                self.engine.cache.reserve(r.slot, chunk.end + len(drafts))
            except OutOfPages:
                drafts = []
        return drafts, None if probs is None or not drafts else probs[:len(drafts)]

    def _full_drafts(self, plan: list[ScheduledChunk]) -> list[tuple[list[int], torch.Tensor | None, int]] | None:
        """Each chunk's drafts padded to k, the draft probabilities of the real ones and how many
        are real (the cap of the device's acceptance: fewer near max_tokens or when the draft gave
        fewer), when every chunk is a decode chunk whose k + 1 positions fit max_model_len (pages
        reserved): the step the verify runner takes. None otherwise (the eager step)."""
        engine, out = self.engine, []
        for chunk in plan:
            r = chunk.request
            if not self._is_decode(chunk) or engine.max_model_len - 1 - chunk.start < self.k:
                return None
            drafts, probs = self._drafts.get(r.request_id, ([], None))
            real = drafts[:self._keepable(r)]
            out.append(([*real, *[0] * (self.k - len(real))], None if probs is None else probs[:len(real)], len(real)))
        try:
            for chunk in plan:
                engine.cache.reserve(chunk.request.slot, chunk.end + self.k)
        except OutOfPages:
            return None
        return out

    def _launch_graph_step(self, plan: list[ScheduledChunk], drafted: list[tuple[list[int], torch.Tensor | None, int]]
                           ) -> GraphStepInFlight:
        """A step of decoding sequences only, drafts padded to k (`engine/verify_runner.py`): the
        verify graph, acceptance (on the device when every request is greedy: nothing waits for
        the GPU), the commit + draft graph and the copy of its packed results to the host."""
        runner = self.verify_runner
        self.device_steps += 1
        requests = [c.request for c in plan]
        for r in requests:
            self._drafts.pop(r.request_id, None)
        caps = [n for _, _, n in drafted]
        rooms = [NO_LIMIT if r.params.max_tokens is None else _tokens_left(r) - 1 for r in requests]
        out = runner.verify([[r.token_at(c.start), *d] for c, r, (d, _, _) in zip(plan, requests, drafted)],
                            [c.start for c in plan], [r.slot for r in requests], caps, rooms)
        if all(r.params.greedy for r in requests):
            return GraphStepInFlight(requests, [c.start for c in plan], caps, out, runner.commit_and_draft())
        best = out.best.tolist()  # rejection sampling on the host: read the target's rows first
        emitted = []
        for b, (r, (d, probs, n)) in enumerate(zip(requests, drafted)):
            if r.params.greedy:
                emitted.append(greedy_tokens(best[b], d[:n]))
            else:
                emitted.append(accept_sampled(processed_probs(out.logits[b], r.params), d[:n], probs,
                                              generator_of(r, out.logits.device)))
        results = runner.commit_and_draft([len(e) - 1 for e in emitted])
        return GraphStepInFlight(requests, [c.start for c in plan], caps, out, results, emitted)

    def _overlappable(self, step: GraphStepInFlight) -> bool:
        """Whether the next step may be launched from this one's results on the device before the
        host reads them: greedy everywhere (acceptance on the device), no logprobs (the next
        replay overwrites the logits), the MTP graph's drafts (filtered on the device, if at all)."""
        if not self.overlap or step.emitted is not None or self.mtp is None or self.drafter is not self.mtp:
            return False
        if self.draft_filter is not None and not hasattr(self.draft_filter, "on_device"):
            return False
        return all(r.params.logprobs is None for r in step.requests)

    def _can_continue(self, step: GraphStepInFlight) -> bool:
        """A continuation needs every running request in the step and still running, nothing
        waiting, and room for the next k + 1 positions whatever this step accepts (pages reserved
        for them)."""
        scheduler, reach = self.engine.scheduler, 2 * self.k + 2  # the next step's last position + 1, at most
        if scheduler.waiting or len(scheduler.running) != len(step.requests):
            return False
        # A continuation's rows start where their requests stand (its predecessor has been read).
        starts = step.starts if step.starts is not None else [r.num_tokens - 1 for r in step.requests]
        if any(r.status is not Status.RUNNING or start + reach > self.engine.max_model_len
               for r, start in zip(step.requests, starts)):
            return False
        try:
            for r, start in zip(step.requests, starts):
                self.engine.cache.reserve(r.slot, start + reach)
        except OutOfPages:
            return False
        return True

    def _launch_continuation(self, step: GraphStepInFlight) -> GraphStepInFlight:
        requests = step.requests
        draft_filter = None
        if self.draft_filter is not None:
            draft_filter = lambda drafts, starts: self.draft_filter.on_device(requests, drafts, starts)  # noqa: E731
        self.device_steps += 1
        self.continuations += 1
        out = self.verify_runner.continue_verify(draft_filter)
        return GraphStepInFlight(requests, None, None, out, self.verify_runner.commit_and_draft())

    def _finish(self, step: GraphStepInFlight) -> list[RequestOutput]:
        """Read a launched step's results (its one synchronisation when greedy) and do its
        bookkeeping; rows of requests that finished or were aborted since the launch are dropped.
        A continuation's rows start where their requests stand now (the host's state then equals
        the one the device assumed)."""
        engine, rows = self.engine, step.results.read()
        updated, items = [], []
        for b, (r, (best, accepted, logprobs, new_drafts)) in enumerate(zip(step.requests, rows)):
            if r.status is not Status.RUNNING:
                continue
            start = step.starts[b] if step.starts is not None else r.num_tokens - 1
            tokens = best[:accepted + 1] if step.emitted is None else step.emitted[b]
            cap = step.caps[b] if step.caps is not None else self._keepable(r)
            self.metrics.record(cap, len(tokens) - 1)
            r.num_computed = start + len(tokens)
            for j, token in enumerate(tokens):
                row = step.out.logits[b, j]
                logprob = logprobs[j] if token == best[j] else float(row[token] - torch.logsumexp(row, dim=-1))
                engine._append_token(r, token, logprob, row)
                if r.finish_reason is not None:
                    break
            updated.append(r)
            if r.status is Status.RUNNING:
                items.append((b, r, start, len(tokens), new_drafts))
        self._propose_after_graph(items, step.out.streams)
        return [request_output(r) for r in updated]

    def _keepable(self, request: Request) -> int:
        """The drafts a step of `request` may keep: k, fewer where the a + 1 tokens a step emits
        must fit max_tokens (a continuation's rows: the request's state before the row)."""
        if request.params.max_tokens is None:
            return self.k
        return max(0, min(self.k, _tokens_left(request) - 1))

    def _propose_after_graph(self, items, streams: torch.Tensor) -> None:
        """Drafts for the sequences still running: the MTP graph's (already on the host), or the
        drafter's (a scripted or other host-side draft) from the verify step's committed positions."""
        if not items:
            return
        if self.drafter is self.mtp and self.mtp is not None:
            proposals = [(new_drafts, None) for *_, new_drafts in items]
        else:
            size = streams.shape[0] // (self.k + 1)
            draft_items = []
            for b, r, start, kept, _ in items:
                committed = torch.arange(kept, device=streams.device) * size + b
                draft_items.append(DraftItem(r, start, r.all_token_ids[start + 1:start + kept + 1],
                                             streams.index_select(0, committed), wants_drafts=True))
            proposals = self.drafter.propose(draft_items, self.k)
        for (_, r, *_), proposal in zip(items, proposals):
            self._drafts[r.request_id] = self._filtered(r, proposal)

    def _filtered(self, request: Request, proposal: tuple[list[int], torch.Tensor | None]):
        if self.draft_filter is None:
            return proposal
        # The filtered drafts are deterministic (q = one-hot): what they replaced was drawn from q.
        return self.draft_filter(request, proposal[0]), None

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Like the plain engine's decode continuations: a greedy device step is left in flight;
        the next call launches its successor from its results on the device (when nothing else
        waits) before reading them, so the GPU has the next step queued during the bookkeeping."""
        engine = self.engine
        previous, self._in_flight = self._in_flight, None
        outputs: list[RequestOutput] = []
        if previous is not None:
            if self._can_continue(previous):
                self._in_flight = self._launch_continuation(previous)
                outputs = self._finish(previous)
                self._drop_stale_drafts()
                return outputs
            outputs = self._finish(previous)
        plan = engine.scheduler.schedule()
        if plan:
            drafted = self._full_drafts(plan)
            if drafted is not None:
                launched = self._launch_graph_step(plan, drafted)
                if self._overlappable(launched):
                    self._in_flight = launched
                else:
                    outputs += self._finish(launched)
            else:
                self.eager_steps += 1
                outputs += self._eager_step(plan)
        self._drop_stale_drafts()
        return outputs

    def _drop_stale_drafts(self) -> None:
        for request_id in [rid for rid in self._drafts if rid not in self.engine._requests]:  # aborted meanwhile
            del self._drafts[request_id]

    def _eager_step(self, plan: list[ScheduledChunk]) -> list[RequestOutput]:
        """A step that also prefills (or whose drafts fall short of k): one prefill-style target
        forward, then the rejected tokens rolled back by snapshot, restore and replay."""
        engine = self.engine
        chunks, tokens, logits_rows, wanted, verify = [], [], [], [], []
        for chunk in plan:
            r = chunk.request
            offset = len(tokens)
            if self._is_decode(chunk):
                drafts, probs = self._drafts_for(chunk)
                n = 1 + len(drafts)
                snapshot = SlotSnapshot(engine.cache, r.slot, chunk.start, n) if drafts else None
                verify.append((drafts, probs, snapshot))
                tokens.extend([r.token_at(chunk.start), *drafts])
                positions = list(range(n))
            else:
                verify.append(None)
                n = chunk.length
                tokens.extend(r.all_token_ids[chunk.start:chunk.end])
                positions = engine._logit_positions(chunk)
            chunks.append(SequenceChunk(r.slot, chunk.start, n, offset))
            logits_rows.extend(offset + i for i in positions)
            wanted.append(positions)
        logits, streams = engine.runner.prefill_with_streams(chunks, tokens, logits_rows)
        bounds = torch.tensor([0] + [len(w) for w in wanted]).cumsum(0).tolist()

        emitted: list[list[int]] = []
        replay: list[tuple[int, list[int]]] = []
        for i, (chunk, spec) in enumerate(zip(plan, verify)):
            rows = logits[bounds[i]:bounds[i + 1]]
            r = chunk.request
            if spec is None:
                engine._record_prompt_logprobs(chunk, wanted[i], rows)
                ends = chunk.end == r.num_tokens
                emitted.append([int(engine.sampler.sample(rows[-1:].float(), [r])[0])] if ends else [])
                continue
            drafts, probs, snapshot = spec
            if r.params.greedy:
                out = accept_greedy(rows, drafts)
            else:
                out = accept_sampled(processed_probs(rows, r.params), drafts, probs, generator_of(r, rows.device))
            accepted = len(out) - 1
            self.metrics.record(len(drafts), accepted)
            if accepted < len(drafts):
                snapshot.restore()
                replay.append((i, tokens[chunks[i].offset:chunks[i].offset + accepted + 1]))
            emitted.append(out)
        if replay:
            replay_chunks, replay_tokens = [], []
            for i, toks in replay:
                replay_chunks.append(SequenceChunk(chunks[i].slot, chunks[i].start, len(toks), len(replay_tokens)))
                replay_tokens.extend(toks)
            engine.runner.prefill(replay_chunks, replay_tokens, [len(replay_tokens) - 1])

        updated, items = [], []
        for i, (chunk, out) in enumerate(zip(plan, emitted)):
            r = chunk.request
            if r.status is not Status.RUNNING:
                continue
            rows = logits[bounds[i]:bounds[i + 1]]
            committed = chunks[i].length if verify[i] is None else len(out)
            r.num_computed = chunk.start + committed
            row0 = len(rows) - 1 if verify[i] is None else 0
            for j, token in enumerate(out):
                row = rows[row0 + j]
                engine._append_token(r, token, float(row[token] - torch.logsumexp(row, dim=-1)), row)
                if r.finish_reason is not None:
                    break
            if out:
                updated.append(r)
            if r.status is Status.RUNNING:
                start = chunks[i].offset
                items.append(DraftItem(r, chunk.start, r.all_token_ids[chunk.start + 1:chunk.start + committed + 1],
                                       streams[start:start + committed],
                                       wants_drafts=r.num_computed == r.num_tokens - 1))
            else:
                self._drafts.pop(r.request_id, None)
        if items:
            for item, proposal in zip(items, self.drafter.propose(items, self.k)):
                if item.wants_drafts:
                    self._drafts[item.request.request_id] = self._filtered(item.request, proposal)
        return [request_output(r) for r in updated]
