"""The bridge between one API request and the engine loop.

An API request becomes one engine request per (prompt, choice): `Generation` submits them,
receives their outputs on an asyncio queue (fed from the engine thread), and aborts whatever is
unfinished when the client goes away or the request's time is up.

Back-pressure and deadlines (`RequestLimits`): `start` refuses the whole request with a 429 and
`Retry-After` while the engine's waiting queue is at `--max-queued-requests` (the check and the
submission run on the event loop with no await between them, so concurrent requests cannot
both slip under the bound). At the deadline a timer on the event loop aborts every unfinished
choice (the engine frees their pages), whether or not a reader is waiting (a stream whose client
reads slowly is stopped too), and queues a 408 that `updates` raises after the outputs before it.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import AsyncIterator, Callable

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse

from v4serve.engine import RequestOutput, SamplingParams
from v4serve.engine.sampling_params import StructuredOutputsParams
from v4serve.server import sse
from v4serve.server.engine_loop import EngineLoop
from v4serve.server.errors import APIError, bad_field, queue_full, request_timeout, server_error
from v4serve.server.limits import RETRY_AFTER_S, RequestLimits
from v4serve.server.protocol import Sampling


def check_prompt(token_ids: list[int], vocab_size: int, max_model_len: int, param: str) -> None:
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_field(param, f"token ids must be in [0, {vocab_size}), got {bad[:5]}")
    if len(token_ids) >= max_model_len:
        raise APIError(
            f"{param}: the prompt has {len(token_ids)} tokens, but this model's context is {max_model_len} tokens "
            f"(prompt plus at least one generated token)", param=param, code="context_length_exceeded")


def sampling_params(s: Sampling, prompt_len: int, max_model_len: int, logprobs: int | None,
                    vocab_size: int | None = None, structured: StructuredOutputsParams | None = None) -> SamplingParams:
    """Engine parameters for one prompt; `max_tokens` must fit in the context left by the prompt;
    `logit_bias` and `stop_token_ids` ids must be in the vocabulary; `structured` (a tool-call
    grammar) replaces the request's own constraint."""
    if vocab_size is not None:
        for name, ids in (("logit_bias", list(s.logit_bias or {})), ("stop_token_ids", list(s.stop_token_ids))):
            bad = [t for t in ids if t >= vocab_size]
            if bad:
                raise bad_field(name, f"token ids must be in [0, {vocab_size}), got {bad[:5]}")
    room = max_model_len - prompt_len
    max_tokens = room if s.max_tokens is None else s.max_tokens
    if max_tokens > room:
        raise APIError(
            f"max_tokens: {max_tokens} tokens do not fit: the prompt has {prompt_len} tokens and this model's "
            f"context is {max_model_len} tokens, so at most {room} can be generated",
            param="max_tokens", code="context_length_exceeded")
    return SamplingParams(
        n=1, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_tokens=max_tokens,
        min_tokens=min(s.min_tokens, max_tokens), stop=list(s.stop), ignore_eos=s.ignore_eos, seed=s.seed,
        logprobs=logprobs, min_p=s.min_p, presence_penalty=s.presence_penalty, frequency_penalty=s.frequency_penalty,
        repetition_penalty=s.repetition_penalty, logit_bias=dict(s.logit_bias or {}),
        stop_token_ids=list(s.stop_token_ids), skip_special_tokens=s.skip_special_tokens,
        prompt_logprobs=s.prompt_logprobs, structured_outputs=structured if structured is not None else s.structured,
    )


class Generation:
    """Engine requests `{request_id}-{choice}`: choice c is prompt c // n, sample c % n."""

    def __init__(self, engine_loop: EngineLoop, request_id: str, prompts: list[list[int]],
                 params: list[SamplingParams], n: int, limits: RequestLimits = RequestLimits()):
        self._engine_loop = engine_loop
        self._limits = limits
        self._timer: asyncio.TimerHandle | None = None  # the request timeout, once started
        self.request_id = request_id
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[int, RequestOutput | Exception]] = asyncio.Queue()
        self.choices: list[tuple[str, list[int], SamplingParams]] = []
        for p, (prompt, sp) in enumerate(zip(prompts, params)):
            for i in range(n):
                seeded = sp if sp.seed is None or i == 0 else replace(sp, seed=sp.seed + i)
                self.choices.append((f"{request_id}-{p * n + i}", prompt, seeded))
        self._open = set(range(len(self.choices)))

    def start(self) -> None:
        """Submit every choice, as one scheduling group: the scheduler interleaves admission
        across groups, so a request with many choices cannot starve the others. Refused whole
        (429, nothing submitted) while the waiting queue is full."""
        bound = self._limits.max_queued_requests
        if bound is not None:
            queued = self._engine_loop.num_queued()
            if queued >= bound:
                raise queue_full(queued, bound, RETRY_AFTER_S)
        if self._limits.request_timeout_s is not None:
            self._timer = self._loop.call_later(self._limits.request_timeout_s, self._expire)
        for index, (engine_id, prompt, params) in enumerate(self.choices):
            self._engine_loop.submit(engine_id, prompt, params, self._sink(index), group=self.request_id)

    def _sink(self, index: int):
        def deliver(item: RequestOutput | Exception) -> None:  # runs on the engine thread
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, (index, item))
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass

        return deliver

    async def updates(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """(choice index, latest output) as the engine produces them, until every choice finished."""
        while self._open:
            index, item = await self._queue.get()
            if isinstance(item, Exception):
                self.abort()
                if isinstance(item, APIError):  # the timeout
                    raise item
                if isinstance(item, ValueError):
                    raise APIError(str(item)) from item
                raise server_error(f"the engine failed: {item}") from item
            if item.finished:
                self._open.discard(index)
            yield index, item
        self._cancel_timer()

    def _expire(self) -> None:
        """The request's time is up: stop its engine requests now, tell the reader next."""
        self._timer = None
        self._queue.put_nowait((-1, request_timeout(self._limits.request_timeout_s)))
        try:
            for index in self._open:
                self._engine_loop.abort(self.choices[index][0])
        except RuntimeError:  # the server is shutting down: the engine loop fails what is left
            pass

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def final(self) -> list[RequestOutput]:
        last: dict[int, RequestOutput] = {}
        async for index, out in self.updates():
            last[index] = out
        return [last[i] for i in range(len(self.choices))]

    def abort(self) -> None:
        self._cancel_timer()
        for index in self._open:
            self._engine_loop.abort(self.choices[index][0])
        self._open.clear()


async def wait_disconnect(request: HTTPRequest) -> None:
    """Returns when the client disconnects (call only after the body has been read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def final_or_disconnect(generation: Generation, request: HTTPRequest) -> list[RequestOutput] | None:
    """The final outputs, or None (after aborting) if the client left first."""
    result = asyncio.ensure_future(generation.final())
    gone = asyncio.ensure_future(wait_disconnect(request))
    try:
        await asyncio.wait({result, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not result.done():
            result.cancel()
            generation.abort()
    return result.result() if result.done() and not result.cancelled() else None


async def respond(
    generation: Generation, http: HTTPRequest, stream: AsyncIterator[str] | None,
    body: Callable[[list[RequestOutput]], dict],
) -> Response:
    """Start a generation, then stream it (`stream` given) or answer with `body(outputs)` once it
    finishes; a client gone before that gets nothing (499) and its requests are aborted."""
    generation.start()
    if stream is not None:
        return StreamingResponse(stream, media_type=sse.MEDIA_TYPE, headers=sse.HEADERS)
    outputs = await final_or_disconnect(generation, http)
    if outputs is None:
        return Response(status_code=499)
    return JSONResponse(body(outputs))
