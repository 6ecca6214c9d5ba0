"""`POST /v1/completions`: text (or token-id) prompts in, completions out, whole or streamed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import AsyncIterator

from fastapi.responses import Response
from starlette.requests import Request as HTTPRequest

from v4serve.engine import RequestOutput, SamplingParams
from v4serve.server import sse
from v4serve.server.context import ServingContext
from v4serve.server.errors import APIError
from v4serve.server.protocol import CompletionRequest, parse_body, parse_completion_request
from v4serve.server.responses import IncrementalText, new_id, now, usage
from v4serve.server.serving import Generation, check_prompt, respond, sampling_params


@dataclass(frozen=True)
class PreparedCompletion:
    req: CompletionRequest  # its prompts dropped once tokenized (no big strings kept)
    prompts: list[list[int]]
    params: list[SamplingParams]


def prepare_completion(ctx: ServingContext, raw: bytes) -> PreparedCompletion:
    """Parse, check and tokenize a body (on a worker thread: this is the CPU-heavy part)."""
    req = parse_completion_request(parse_body(raw))
    ctx.check_model(req.model)
    ctx.check_fan_out(len(req.prompts), req.sampling.n, "prompt")
    prompts = []
    for i, prompt in enumerate(req.prompts):
        param = "prompt" if len(req.prompts) == 1 else f"prompt[{i}]"
        ids = ctx.tokenize(prompt, param) if isinstance(prompt, str) else list(prompt)
        check_prompt(ids, ctx.vocab_size, ctx.max_model_len, param)
        prompts.append(ids)
    params = [sampling_params(req.sampling, len(ids), ctx.max_model_len, req.logprobs, ctx.vocab_size)
              for ids in prompts]
    return PreparedCompletion(replace(req, prompts=[]), prompts, params)


async def create_completion(ctx: ServingContext, prepared: PreparedCompletion, http: HTTPRequest) -> Response:
    req = prepared.req
    request_id = new_id("cmpl")
    generation = Generation(ctx.engine_loop, request_id, prepared.prompts, prepared.params, req.sampling.n,
                            limits=ctx.limits)
    stream = _stream(ctx, req, generation, request_id) if req.sampling.stream else None
    return await respond(generation, http, stream, lambda outputs: {
        "id": request_id, "object": "text_completion", "created": now(), "model": ctx.model_name,
        "choices": [_choice(ctx, req, index, out) for index, out in enumerate(outputs)],
        "usage": usage(outputs, req.sampling.n),
    })


def _choice(ctx: ServingContext, req: CompletionRequest, index: int, out: RequestOutput) -> dict:
    c = out.outputs[0]
    logprobs = None
    if req.logprobs is not None:
        logprobs = ctx.logprobs.completions(c.logprobs, c.token_ids, req.logprobs, offset=0)
    choice = {"index": index, "text": c.text, "logprobs": logprobs, "finish_reason": c.finish_reason,
              "stop_reason": c.stop_reason}
    if req.sampling.prompt_logprobs is not None:
        choice["prompt_logprobs"] = ctx.logprobs.prompt(out.prompt_logprobs)
    return choice


async def _stream(ctx: ServingContext, req: CompletionRequest, generation: Generation,
                  request_id: str) -> AsyncIterator[str]:
    created = now()
    head = {"id": request_id, "object": "text_completion", "created": created, "model": ctx.model_name}
    texts = [IncrementalText(req.sampling.stop) for _ in generation.choices]
    num_sent = [0] * len(generation.choices)
    last: dict[int, RequestOutput] = {}
    try:
        async for index, out in generation.updates():
            last[index] = out
            c = out.outputs[0]
            offset = len(texts[index].sent)
            delta = texts[index].update(c.text, out.finished)
            new_ids = c.token_ids[num_sent[index]:]
            logprobs = None
            if req.logprobs is not None and new_ids:
                logprobs = ctx.logprobs.completions(c.logprobs[num_sent[index]:], new_ids, req.logprobs, offset)
            num_sent[index] = len(c.token_ids)
            if delta or logprobs or out.finished:
                choice = {"index": index, "text": delta, "logprobs": logprobs,
                          "finish_reason": c.finish_reason if out.finished else None}
                yield sse.event({**head, "choices": [choice]})
        if req.sampling.include_usage:
            outputs = [last[i] for i in range(len(generation.choices))]
            yield sse.event({**head, "choices": [], "usage": usage(outputs, req.sampling.n)})
    except APIError as e:
        yield sse.event(e.body())
    finally:
        generation.abort()  # no-op unless the client left or the stream failed
    yield sse.DONE
