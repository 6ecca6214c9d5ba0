"""Continuous batching: which requests run in the next step, and how many of their tokens.

Each step has a token budget. Running requests go first, in arrival order (a decoding request
needs one token, a request still prefilling gets the next chunk of its prompt); then waiting
requests are admitted while a sequence slot, budget and KV pages remain.
When pages run out, the most recently arrived running request is preempted: its slot and pages
are freed at once and it waits again, to be recomputed from its prompt and the tokens it has
generated so far (nothing is lost).

Admission is shared between groups (a group: the sequences of one API request, prompts x n;
an ungrouped request is a group of its own). The next sequence admitted is the earliest
waiting sequence of the group that has the fewest running sequences; ties go to the group
whose earliest waiting sequence arrived first. So a request of 1,000 sequences takes the free
slots while nothing else waits, but a request arriving after it gets the next free slot
instead of waiting for all 1,000; within a group, and among single-sequence requests,
admission is first-come-first-served. When the chosen sequence does not fit the free pages,
admission stops for this step (nothing overtakes it, so it cannot starve either).
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from v4serve.cache import OutOfPages, PagedKVCache
from v4serve.cache.kv_cache import PrefixHit
from v4serve.engine.request import Request, Status


@dataclass(frozen=True)
class ScheduledChunk:
    request: Request
    start: int  # first position computed in this step
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


class Scheduler:
    def __init__(self, cache: PagedKVCache, max_num_seqs: int, max_num_batched_tokens: int):
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs})"
            )
        self.cache = cache
        self.max_num_seqs = min(max_num_seqs, cache.max_seqs)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0  # since start, over all requests

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, request: Request) -> None:
        """Remove a finished or aborted request and free its slot and pages at once."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)
        if request.slot is not None:
            self.cache.close_sequence(request.slot)
            request.slot = None
        request.status = Status.FINISHED

    def schedule(self) -> list[ScheduledChunk]:
        budget = self.max_num_batched_tokens
        plan: list[ScheduledChunk] = []
        # In arrival order, so a preemption victim (the latest arrival) is never already planned.
        self.running.sort(key=lambda r: r.arrival)
        for request in list(self.running):
            if budget == 0:
                break
            if request not in self.running:  # preempted while making room for an earlier request
                continue
            length = self._chunk_length(request.num_computed, request.num_tokens, budget)
            if not self._reserve(request, request.num_computed + length):
                continue
            plan.append(ScheduledChunk(request, request.num_computed, length))
            budget -= length
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and self.cache.num_free_slots:
            request = self._next_admission()
            # Cached pages of its prefix (none for prompt logprobs: every prompt position is scored).
            hit = PrefixHit([], 0, 0) if request.wants_prompt_logprobs else self.cache.match_prefix(request.all_token_ids)
            start = len(hit.pages) * self.cache.page_size
            length = self._chunk_length(start, request.num_tokens, budget)
            if self.cache.pages_to_admit(hit, start + length) > 0:
                break
            self.waiting.remove(request)
            request.slot = self.cache.open_sequence()
            request.status = Status.RUNNING
            self.cache.attach_prefix(request.slot, hit, request.num_tokens)
            request.num_computed = start
            if self.cache.prefix is not None:
                self.cache.prefix.queries += request.num_tokens
                self.cache.prefix.hits += start
            self.cache.reserve(request.slot, start + length)
            self.running.append(request)
            plan.append(ScheduledChunk(request, start, length))
            budget -= length
        return plan

    def _chunk_length(self, start: int, num_tokens: int, budget: int) -> int:
        """Tokens to compute from `start`: up to the budget, and with prefix caching never past the
        next multiple of the cache's chunk grid (`PagedKVCache.enable_prefix_caching`), so a
        cold run and a hit that resumes on the grid compute each chunk with the same shapes, and
        the state at each snapshot position exists at the end of a step."""
        length = min(num_tokens - start, budget)
        if self.cache.prefix is not None:
            g = self.cache.chunk_grid
            length = min(length, g - start % g)
        return length

    def _next_admission(self) -> Request:
        """The earliest waiting sequence of the group with the fewest running sequences (ties:
        the group whose earliest waiting sequence arrived first). The waiting queue is in
        arrival order, so a group's first occurrence there is its earliest waiting sequence."""
        if len(self.waiting) == 1:
            return self.waiting[0]
        running = Counter(r.group_key for r in self.running)
        best, best_count, seen = None, 0, set()
        for request in self.waiting:
            key = request.group_key
            if key in seen:
                continue
            seen.add(key)
            count = running[key]
            if best is None or count < best_count:
                best, best_count = request, count
                if count == 0:
                    break  # nothing beats an idle group that arrived first
        return best

    def _reserve(self, request: Request, num_tokens: int) -> bool:
        """Pages for `num_tokens`; preempt later arrivals (or this request, if it is the latest) when short."""
        while True:
            try:
                self.cache.reserve(request.slot, num_tokens)
                return True
            except OutOfPages:
                victim = max(self.running, key=lambda r: r.arrival)
                self._preempt(victim)
                if victim is request:
                    return False

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.cache.close_sequence(request.slot)
        request.slot = None
        request.num_computed = 0
        request.status = Status.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        # Back to the queue in arrival order, ahead of anything that arrived later.
        position = sum(1 for r in self.waiting if r.arrival < request.arrival)
        self.waiting.insert(position, request)
