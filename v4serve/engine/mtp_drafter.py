"""The draft of speculative decoding: what a drafter is given and returns (`DraftItem`, `Drafter`)
and the model's MTP layer as one (`MTPDrafter`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from v4serve.cache import CacheGeometry, PagedKVCache, SequenceChunk
from v4serve.engine.request import Request
from v4serve.engine.spec_decode import generator_of, processed_probs


@dataclass
class DraftItem:
    """One chunk's committed positions [start, start + n) for the draft: the target's final
    streams there [n, hc, D] (None for a draft that does not read them), the tokens that follow
    each position (`next_tokens`, n of them) and whether the sequence wants drafts now."""

    request: Request
    start: int
    next_tokens: list[int]
    streams: torch.Tensor | None
    wants_drafts: bool


class Drafter(Protocol):
    def propose(self, items: list[DraftItem], k: int) -> list[tuple[list[int], torch.Tensor | None]]:
        """For each item: its drafts (<= k tokens; any for items not wanting drafts) and the draft
        probabilities [len, V] they were drawn from (None: deterministic drafts)."""


class MTPDrafter:
    """The model's MTP layer as the draft, with its own window-only cache (one layer; slots are
    the target cache's). Each step it runs over every committed position (prompt chunks too, so
    its window holds the whole recent history), then drafts recursively: draft j + 1 reads the
    layer's own output streams of draft j in place of the target's."""

    def __init__(self, model, target: PagedKVCache):
        from v4serve.model.mtp import mtp_model_plan

        self.model = model
        geometry = CacheGeometry.from_plan(mtp_model_plan(target.plan), target.page_size)
        self.cache = PagedKVCache(geometry, num_pages=1, max_seqs=target.max_seqs,
                                  max_step_tokens=target.max_step_tokens, max_pages_per_seq=1,
                                  dtype=target.dtype, device=target.device,
                                  ring_extra=target.ring_size - target.page_size)

    def _run(self, chunks: list[SequenceChunk], tokens: list[int], streams: torch.Tensor, rows: list[int]):
        batch = self.cache.build_batch(chunks, tokens, rows)
        return self.model.forward_mtp(streams, batch, self.cache)

    def propose(self, items: list[DraftItem], k: int) -> list[tuple[list[int], torch.Tensor | None]]:
        chunks, tokens, rows, wanting = [], [], [], []
        for i, item in enumerate(items):
            offset = len(tokens)
            chunks.append(SequenceChunk(item.request.slot, item.start, len(item.next_tokens), offset))
            tokens.extend(item.next_tokens)
            if item.wants_drafts:
                rows.append(len(tokens) - 1)
                wanting.append(i)
        out: list[tuple[list[int], torch.Tensor | None]] = [([], None) for _ in items]
        if not chunks:
            return out
        logits, streams = self._run(chunks, tokens, torch.cat([it.streams for it in items]), rows or [0])
        if not wanting:
            return out
        drafts = [[] for _ in wanting]
        probs = [[] for _ in wanting]
        last = streams[torch.tensor(rows, device=streams.device)]
        for j in range(k):
            picked = self._pick(logits, [items[i].request for i in wanting], drafts, probs)
            if j == k - 1:
                break
            step_chunks = [SequenceChunk(items[i].request.slot, items[i].start + len(items[i].next_tokens) + j, 1, b)
                           for b, i in enumerate(wanting)]
            logits, last = self._run(step_chunks, picked, last, list(range(len(wanting))))
        for b, i in enumerate(wanting):
            sampled = not items[i].request.params.greedy
            out[i] = (drafts[b], torch.stack(probs[b]) if sampled else None)
        return out

    @staticmethod
    def _pick(logits: torch.Tensor, requests: list[Request], drafts: list[list[int]], probs: list[list]) -> list[int]:
        picked = torch.argmax(logits, dim=-1).tolist()
        for b, request in enumerate(requests):
            if not request.params.greedy:
                q = processed_probs(logits[b:b + 1], request.params)[0]
                picked[b] = int(torch.multinomial(q, 1, generator=generator_of(request, q.device))[0])
                probs[b].append(q)
            drafts[b].append(picked[b])
        return picked
