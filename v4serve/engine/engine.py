"""The engine: requests, admission and steps, over a model runner (`model_runner.py`: the model,
the KV cache and the decode graphs) and the scheduler.

`LLM` (offline) and the HTTP server both drive it: `add_request`, then `step()` until
`has_unfinished()` is false; each step returns the requests it advanced.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import torch

from v4serve.cache import OutOfPages, SequenceChunk
from v4serve.engine.args import EngineArgs, resolve_device, resolve_dtype
from v4serve.engine.detokenizer import IncrementalDetokenizer, token_text
from v4serve.engine.model_runner import ModelRunner
from v4serve.engine.outputs import RequestOutput
from v4serve.engine.request_output import request_output
from v4serve.engine.stopping import update_after_token
from v4serve.engine.request import Request, Status
from v4serve.engine.sampler import Sampler, position_logprobs
from v4serve.engine.sampling_params import SamplingParams
from v4serve.engine.scheduler import ScheduledChunk, Scheduler
from v4serve.engine.structured_output import StructuredOutputs, accept
from v4serve.tokenizer import Tokenizer
from v4serve.presets import is_preset

__all__ = ["Engine", "EngineArgs", "resolve_dtype"]

logger = logging.getLogger(__name__)


@dataclass
class StepInFlight:
    """A launched step: its plan, the logits rows it will read, and its sampled tokens on the way to
    the host (`host`: [2, n] token ids and their logprobs, ready once `done` has fired)."""

    plan: list[ScheduledChunk]
    wanted: list[list[int]]
    rows: list[torch.Tensor]
    ending: list[int]
    decode: bool
    sampled: torch.Tensor | None = None
    last: torch.Tensor | None = None  # the logits rows that sample [len(ending), V]
    deferred: torch.Tensor | None = None  # a continuation's grammar waits for these tokens (the previous step's)
    host: torch.Tensor | None = None
    done: torch.cuda.Event | None = None


class Engine:
    def __init__(self, args: EngineArgs):
        self.device = device = resolve_device(args.device)
        self.runner = ModelRunner(args, device, resolve_dtype(args.dtype, device))
        self.config = self.runner.config
        self.max_model_len = self.runner.max_model_len
        self.tokenizer = Tokenizer.for_model(None if is_preset(args.model) else args.model)
        self.scheduler = Scheduler(self.cache, args.max_num_seqs, args.max_num_batched_tokens)
        self.sampler = Sampler(self.config.vocab_size, self.cache.padding_slot + 1, self.config.eos_token_ids,
                               device)
        self.structured = StructuredOutputs(self.tokenizer, self.config.vocab_size, self.config.eos_token_ids)
        self._seeds = torch.Generator().manual_seed(args.seed)
        self._arrivals = itertools.count()
        self._requests: dict[str, Request] = {}
        self._in_flight: StepInFlight | None = None  # a launched decode step whose tokens are not yet read
        self.overlap_decode = args.overlap_decode
        self.decode_continuations = 0  # decode steps launched before their predecessor's tokens were read
        # Speculative decoding (engine/speculative.py): its own step and its own continuations.
        self.spec = None
        if self.runner.speculative is not None:
            from v4serve.engine.speculative import SpeculativeStepper

            self.spec = SpeculativeStepper(self, self.runner.speculative, overlap=args.overlap_decode)
            self.overlap_decode = False

    # The runner's parts, by the names the server, the benchmarks and the tests use.
    @property
    def model(self):
        return self.runner.model

    @model.setter
    def model(self, model) -> None:  # a test stands in a scripted model (prefill; the decode runner has its own)
        self.runner.model = model

    @property
    def cache(self):
        return self.runner.cache

    @property
    def kv_budget(self):
        return self.runner.kv_budget

    @property
    def decode_runner(self):
        return self.runner.decode_runner

    def banner(self) -> list[str]:
        """Start-up lines: the KV cache dtype, `KV cache size: N tokens`, `Maximum concurrency ...`,
        every tier's bytes, prefix caching, the memory map (`ModelRunner.banner`)."""
        return self.runner.banner()

    # ------------------------------------------------------------------ requests
    def validate_prompt(self, prompt_token_ids: list[int]) -> None:
        if not prompt_token_ids:
            raise ValueError("the prompt is empty")
        v41 = self.config.v41  # DeepSeek-V4.1 runs text only here (no vision tower)
        if v41 is not None and v41.image_token_id is not None and v41.image_token_id in prompt_token_ids:
            raise ValueError(
                f"the prompt holds the image token id {v41.image_token_id}: image inputs are not supported "
                "(this engine runs DeepSeek-V4.1's text model only)"
            )
        vocab = self.config.vocab_size
        bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:5]}")
        if len(prompt_token_ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt_token_ids)} tokens; the maximum model length is "
                f"{self.max_model_len} (prompt plus at least one generated token)"
            )

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, prompt: str | None = None,
        group: str | None = None,
    ) -> None:
        """Queue a request. `group` (default: the request itself) is what the scheduler shares
        admission between: the sequences of one API request (prompts x n) form one group."""
        self.validate_prompt(prompt_token_ids)
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        vocab = self.config.vocab_size
        bad = [t for t in params.logit_bias if t >= vocab]
        if bad:
            raise ValueError(f"logit_bias: token ids must be in [0, {vocab}), got {bad[:5]}")
        if self.spec is not None:
            from v4serve.engine.spec_config import check_request

            check_request(params)
        grammar = None if params.structured_outputs is None else self.structured.matcher(params.structured_outputs)
        seed = params.seed if params.seed is not None else int(torch.randint(2**62, (1,), generator=self._seeds))
        request = Request(
            request_id=request_id,
            prompt_token_ids=list(prompt_token_ids),
            params=params,
            arrival=next(self._arrivals),
            prompt=prompt,
            group=group,
            seed=seed,
            grammar=grammar,
            detokenizer=IncrementalDetokenizer(self.tokenizer, params.skip_special_tokens),
        )
        if params.prompt_logprobs is not None:
            request.prompt_logprobs.append(None)  # nothing scores the first prompt token
        self._requests[request_id] = request
        self.scheduler.add(request)

    def abort(self, request_id: str) -> None:
        """Stop a request (client gone); its slot and pages are freed at once."""
        request = self._requests.pop(request_id, None)
        if request is not None and request.status is not Status.FINISHED:
            request.finish_reason = "abort"
            self.scheduler.finish(request)

    def has_unfinished(self) -> bool:
        return (self.scheduler.has_unfinished() or self._in_flight is not None
                or (self.spec is not None and self.spec.in_flight))

    # ------------------------------------------------------------------ stepping
    def step(self) -> list[RequestOutput]:
        """Advance every running request by one step; return the outputs of the requests that got a
        token or finished.

        Pure decode steps overlap the host with the GPU: a step is launched and left in flight;
        the next call launches its continuation (fed the sampled tokens on the device) before it
        waits for the step's tokens and does their bookkeeping, so the GPU always has the next
        step queued. A request that finishes (or is aborted) meanwhile has its extra row
        discarded; the GPU's stream order keeps that row's cache writes ahead of any later reuse
        of its slot and pages."""
        if self.spec is not None:
            return self.spec.step()
        previous, self._in_flight = self._in_flight, None
        if previous is not None and self._can_continue(previous):
            self._in_flight = self._launch_continuation(previous)
            if self._in_flight is not None:
                self.decode_continuations += 1
                outputs = self._complete(previous)
                if self._in_flight.deferred is not None:  # the grammars now know the previous tokens
                    self._sample(self._in_flight, in_flight=0)
                return outputs
        outputs = self._complete(previous) if previous is not None else []
        plan = self.scheduler.schedule()
        if plan:
            launched = self._launch(plan)
            if launched.decode and self.overlap_decode:
                self._in_flight = launched
            else:
                outputs += self._complete(launched)
        return outputs

    def _launch(self, plan: list[ScheduledChunk], token_ids: torch.Tensor | None = None) -> StepInFlight:
        """Enqueue a step's forward and sampling on the device; nothing waits for the GPU here.
        `token_ids` (on the device) feeds a decode continuation, whose requests all sample."""
        wanted = [[0] for _ in plan] if token_ids is not None else [self._logit_positions(c) for c in plan]
        decode = all(chunk.length == 1 for chunk in plan)
        if decode:
            # One token per sequence: the device-addressed (CUDA-graph) path, logits for every row.
            logits = self.runner.decode(
                token_ids if token_ids is not None else [c.request.token_at(c.start) for c in plan],
                [c.start for c in plan],
                [c.request.slot for c in plan],
            )
            rows = [logits[b:b + len(w)] for b, w in enumerate(wanted)]
            last_rows = list(range(len(plan)))
        else:
            chunks, tokens, logits_rows = [], [], []
            for chunk, positions in zip(plan, wanted):
                offset = len(tokens)
                chunks.append(SequenceChunk(chunk.request.slot, chunk.start, chunk.length, offset))
                tokens.extend(chunk.request.all_token_ids[chunk.start:chunk.end])
                logits_rows.extend(offset + i for i in positions)
            logits = self.runner.prefill(chunks, tokens, logits_rows)
            bounds = torch.tensor([0] + [len(w) for w in wanted]).cumsum(0).tolist()
            rows = [logits[a:b] for a, b in zip(bounds, bounds[1:])]
            last_rows = [b - 1 for b in bounds[1:]]
        self.cache.snapshot_pages([(c.request.slot, c.end) for c in plan])  # prefix caching: page-end states
        # Chunks that reach their sequence's end sample a token, all at once, on the device.
        ending = list(range(len(plan))) if token_ids is not None else [
            i for i, chunk in enumerate(plan) if chunk.end == chunk.request.num_tokens
        ]
        step = StepInFlight(plan, wanted, rows, ending, decode)
        if ending:
            picks = [last_rows[i] for i in ending]
            step.last = logits if picks == list(range(logits.shape[0])) else logits[picks]
            if token_ids is not None and any(plan[i].request.grammar is not None for i in ending):
                step.deferred = token_ids  # sampled in `step` once the previous step's tokens are read
            else:
                self._sample(step, in_flight=0 if token_ids is None else 1, pending=token_ids)
        return step

    def _sample(self, step: StepInFlight, in_flight: int, pending: torch.Tensor | None = None) -> None:
        """Enqueue the sampling of a launched step's ending rows (after its forward or graph replay)
        and the copy of the tokens and their logprobs to the host."""
        requests = [step.plan[i].request for i in step.ending]
        last = step.last
        bitmask = self.structured.bitmask([r.grammar for r in requests])
        must_end = set()
        if bitmask is not None:
            short = [i for i, r in enumerate(requests) if len(r.output_token_ids) + in_flight < r.params.min_tokens]
            must_end = self.structured.only_stops(bitmask, short) if short else set()
            bitmask = bitmask.pin_memory() if self.device.type == "cuda" else bitmask
            bitmask = bitmask.to(self.device, non_blocking=True)
        step.sampled = self.sampler.sample(last, requests, in_flight, pending, bitmask, must_end)
        chosen = last.gather(1, step.sampled[:, None])[:, 0] - torch.logsumexp(last, dim=-1)
        step.host = torch.empty(2, len(step.ending), dtype=torch.float64, pin_memory=self.device.type == "cuda")
        step.host.copy_(torch.stack((step.sampled.double(), chosen.double())), non_blocking=True)
        if self.device.type == "cuda":
            step.done = torch.cuda.Event()
            step.done.record()

    def _can_continue(self, step: StepInFlight) -> bool:
        """A decode step may be followed before its tokens are known when nothing else waits, every
        running request is in it and sampled in it, and none needs its logits on the host (top-N
        logprobs)."""
        if not self.overlap_decode or not step.decode or self.scheduler.waiting:
            return False
        if len(self.scheduler.running) != len(step.plan) or len(step.ending) != len(step.plan):
            return False  # someone else runs, or a one-token prefill chunk has no sampled token to feed
        for chunk in step.plan:
            request = chunk.request
            if request.status is not Status.RUNNING or request.params.logprobs is not None:
                return False
            if request.wants_prompt_logprobs or chunk.start + 2 > self.max_model_len:
                return False
        return True

    def _launch_continuation(self, step: StepInFlight) -> StepInFlight | None:
        """The next decode step of the same requests, or None when pages run short (the scheduler,
        which may preempt, then plans the step once the tokens are known)."""
        plan = [ScheduledChunk(c.request, c.start + 1, 1) for c in step.plan]
        try:
            for chunk in plan:
                self.cache.reserve(chunk.request.slot, chunk.end)
        except OutOfPages:
            return None
        return self._launch(plan, token_ids=step.sampled)

    def _complete(self, step: StepInFlight) -> list[RequestOutput]:
        """Wait for a step's tokens (one sync), then record them; rows of requests that finished or
        were aborted since the launch are dropped."""
        if step.done is not None:
            step.done.synchronize()
        sampled = dict(zip(step.ending, zip(*step.host.tolist()))) if step.ending else {}
        updated = []
        for i, (chunk, positions, chunk_logits) in enumerate(zip(step.plan, step.wanted, step.rows)):
            request = chunk.request
            if request.status is not Status.RUNNING:
                continue
            request.num_computed = chunk.end
            self.cache.register_pages(request.slot, request.num_computed, lambda: request.all_token_ids)
            self._record_prompt_logprobs(chunk, positions, chunk_logits)
            if i in sampled:
                token, logprob = sampled[i]
                self._append_token(request, int(token), logprob, chunk_logits[-1])
                updated.append(request)
        return [request_output(r) for r in updated]

    def _logit_positions(self, chunk: ScheduledChunk) -> list[int]:
        """Chunk-relative positions whose logits are needed: prompt positions whose next prompt token
        still lacks its logprob, and the sequence's last token when the chunk reaches it."""
        request = chunk.request
        wanted = []
        if request.wants_prompt_logprobs:
            first = len(request.prompt_logprobs) - 1  # logits at position i score prompt token i + 1
            wanted = list(range(max(chunk.start, first), min(chunk.end, len(request.prompt_token_ids) - 1)))
        if chunk.end == request.num_tokens:
            wanted.append(chunk.end - 1)
        return [p - chunk.start for p in wanted]

    def _record_prompt_logprobs(self, chunk: ScheduledChunk, positions: list[int], logits: torch.Tensor) -> None:
        request = chunk.request
        if not request.wants_prompt_logprobs:
            return
        logprobs = torch.log_softmax(logits, dim=-1)
        for i, pos in enumerate(positions):
            scored = chunk.start + pos + 1
            if scored < len(request.prompt_token_ids) and scored == len(request.prompt_logprobs):
                token = request.prompt_token_ids[scored]
                request.prompt_logprobs.append(
                    position_logprobs(logprobs[i], token, request.params.prompt_logprobs, self._token_text)
                )

    def _token_text(self, token_id: int) -> str:
        return token_text(self.tokenizer, token_id)

    def _append_token(self, request: Request, token: int, logprob: float, logits: torch.Tensor) -> None:
        request.output_token_ids.append(token)
        request.cumulative_logprob += logprob
        if request.params.logprobs is not None:
            request.output_logprobs.append(position_logprobs(
                torch.log_softmax(logits, dim=-1), token, request.params.logprobs, self._token_text
            ))
        update_after_token(request, token, self.config.eos_token_ids, self.max_model_len)
        if request.grammar is not None and request.finish_reason is None:
            if not accept(request.grammar, token):
                request.finish_reason, request.stop_reason = "stop", "grammar"  # the mask allows only accepted tokens
            elif request.grammar.is_terminated():  # its end (a stop token), even before min_tokens: nothing may follow
                request.finish_reason = "stop"
            if request.finish_reason is not None:
                request.detokenizer.flush()
                request.text = request.detokenizer.text
        if request.finish_reason is not None:
            self.scheduler.finish(request)
            self._requests.pop(request.request_id, None)
