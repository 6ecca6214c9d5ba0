"""Per-request limits shared by the app and the `serve` flags (no fastapi import here)."""

from __future__ import annotations

from dataclasses import dataclass

MAX_SEQS_PER_REQUEST = 256  # prompts x n of one request (--max-seqs-per-request)
RETRY_AFTER_S = 1  # the Retry-After of a 429 (the waiting queue is full)


@dataclass(frozen=True)
class RequestLimits:
    """Back-pressure and deadlines, the same for every request of a server.

    max_queued_requests: a request is refused (429, Retry-After) while this many engine requests
        (one per prompt x choice) already wait for a slot or pages, counting those submitted but
        not yet seen by the engine thread. A request admitted below the bound is admitted whole,
        so the queue can exceed it by one request's sequences. None: unbounded.
    request_timeout_s: a request still unfinished this long after it was submitted is aborted
        (its pages freed) and answered with a 408 (an error event in a stream). None: no limit.
    """

    max_queued_requests: int | None = None
    request_timeout_s: float | None = None
