"""`POST /v1/chat/completions`: messages encoded in the DeepSeek-V4 chat format; the completion
parsed back into `reasoning_content`, `content` and `tool_calls`, whole or as streamed deltas.

A tool-call block that does not parse comes back as plain content (status 200): the model's
mistake is the client's data, not a server error. Why it did not parse is not lost: the choice
carries `parse_error` (a string, null when every block parsed; in a stream, on the chunk that
has the choice's `finish_reason`), and a WARNING log line names the request and the reason.
OpenAI clients keep the field in `choice.model_extra`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import AsyncIterator

from fastapi.responses import Response
from starlette.requests import Request as HTTPRequest

from v4serve.chat import StreamingParser, encode_messages, parse_completion
from v4serve.engine import RequestOutput, SamplingParams
from v4serve.engine.sampling_params import StructuredOutputsParams
from v4serve.engine.structured_output_dsml import tool_call_grammar
from v4serve.server import sse
from v4serve.server.context import ServingContext
from v4serve.server.errors import APIError
from v4serve.server.prompt_length import rendered_content_chars
from v4serve.server.protocol import ChatRequest, parse_body, parse_chat_request
from v4serve.server.responses import IncrementalText, new_id, now, usage
from v4serve.server.serving import Generation, check_prompt, respond, sampling_params

log = logging.getLogger("v4serve.server")


@dataclass(frozen=True)
class PreparedChat:
    req: ChatRequest  # its messages dropped once encoded (no big strings kept)
    ids: list[int]
    params: SamplingParams


def prepare_chat_completion(ctx: ServingContext, raw: bytes) -> PreparedChat:
    """Parse, check, encode and tokenize a body (on a worker thread: the CPU-heavy part)."""
    req = parse_chat_request(parse_body(raw))
    ctx.check_model(req.model)
    ctx.check_fan_out(1, req.sampling.n, "n")
    ctx.prompt_limit.check_chars(rendered_content_chars(req.messages), "messages")  # before encoding it
    ids = ctx.tokenize(_encode(req), "messages")
    check_prompt(ids, ctx.vocab_size, ctx.max_model_len, "messages")
    params = sampling_params(req.sampling, len(ids), ctx.max_model_len, req.logprobs, ctx.vocab_size,
                             _tool_grammar(req))
    return PreparedChat(replace(req, messages=[]), ids, params)


async def create_chat_completion(ctx: ServingContext, prepared: PreparedChat, http: HTTPRequest) -> Response:
    req = prepared.req
    request_id = new_id("chatcmpl")
    generation = Generation(ctx.engine_loop, request_id, [prepared.ids], [prepared.params], req.sampling.n,
                            limits=ctx.limits)
    stream = _stream(ctx, req, generation, request_id) if req.sampling.stream else None
    return await respond(generation, http, stream, lambda outputs: {
        "id": request_id, "object": "chat.completion", "created": now(), "model": ctx.model_name,
        "choices": [_choice(ctx, req, request_id, index, out) for index, out in enumerate(outputs)],
        "usage": usage(outputs, req.sampling.n),
        **({"prompt_logprobs": ctx.logprobs.prompt(outputs[0].prompt_logprobs)}
           if req.sampling.prompt_logprobs is not None else {}),
    })


def _tool_grammar(req: ChatRequest) -> StructuredOutputsParams | None:
    """`tool_choice: "required"` or a named function: the completion is constrained to a DSML
    tool-call block (one or more calls of the tools, or exactly one call of the named one)."""
    if req.tool_choice in ("auto", "none"):
        return None
    name = None if req.tool_choice == "required" else req.tool_choice["function"]["name"]
    return StructuredOutputsParams(grammar=tool_call_grammar(req.tools, name))


def _encode(req: ChatRequest) -> str:
    try:
        return encode_messages(req.messages, req.thinking_mode, reasoning_effort=req.reasoning_effort,
                               tools=req.tools)
    except ValueError as e:  # the chat package names the field: "messages[2].content: missing"
        message = str(e)
        field = message.split(":", 1)[0] if ":" in message else "messages"
        raise APIError(message, param=field) from None


def _tool_names(req: ChatRequest) -> set[str]:
    """Tools the model may call; an empty set turns every tool-call block into content."""
    if not req.parse_tools:
        return set()
    return {t["function"]["name"] for t in req.tools}


def _parse_error(request_id: str, index: int, error: str | None) -> str | None:
    """`error` as the choice's `parse_error`, logged first: the client may not look at the field,
    and whoever runs the server wants to see how often the model writes broken tool calls."""
    if error is not None:
        log.warning("%s choice %d: tool-call block returned as content: %s", request_id, index, error)
    return error


def _choice(ctx: ServingContext, req: ChatRequest, request_id: str, index: int, out: RequestOutput) -> dict:
    c = out.outputs[0]
    parsed = parse_completion(c.text, req.thinking_mode, _tool_names(req))
    logprobs = None
    if req.logprobs is not None:
        logprobs = ctx.logprobs.chat(c.logprobs, c.token_ids, req.logprobs)
    reason = "tool_calls" if parsed.tool_calls else c.finish_reason
    return {"index": index, "message": parsed.to_message(), "logprobs": logprobs, "finish_reason": reason,
            "parse_error": _parse_error(request_id, index, parsed.error)}


async def _stream(ctx: ServingContext, req: ChatRequest, generation: Generation,
                  request_id: str) -> AsyncIterator[str]:
    head = {"id": request_id, "object": "chat.completion.chunk", "created": now(), "model": ctx.model_name}
    n = len(generation.choices)
    texts = [IncrementalText(req.sampling.stop) for _ in range(n)]
    parsers = [StreamingParser(req.thinking_mode, _tool_names(req)) for _ in range(n)]
    called = [False] * n
    num_sent = [0] * n
    last: dict[int, RequestOutput] = {}

    def chunk(index: int, delta: dict, logprobs=None, finish_reason=None) -> str:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        if finish_reason is not None:  # the choice's last chunk
            choice["parse_error"] = _parse_error(request_id, index, parsers[index].error)
        return sse.event({**head, "choices": [choice]})

    try:
        for index in range(n):
            yield chunk(index, {"role": "assistant", "content": ""})
        async for index, out in generation.updates():
            last[index] = out
            c = out.outputs[0]
            deltas = parsers[index].feed(texts[index].update(c.text, out.finished))
            if out.finished:
                deltas += parsers[index].finish()[0]
            called[index] |= any("tool_calls" in d for d in deltas)
            logprobs = None
            if req.logprobs is not None and len(c.token_ids) > num_sent[index]:
                logprobs = ctx.logprobs.chat(c.logprobs[num_sent[index]:], c.token_ids[num_sent[index]:],
                                             req.logprobs)
            num_sent[index] = len(c.token_ids)
            for delta in deltas or ([{}] if logprobs else []):
                yield chunk(index, delta, logprobs)
                logprobs = None
            if out.finished:
                yield chunk(index, {}, finish_reason="tool_calls" if called[index] else c.finish_reason)
        if req.sampling.include_usage:
            outputs = [last[i] for i in range(n)]
            yield sse.event({**head, "choices": [], "usage": usage(outputs, req.sampling.n)})
    except APIError as e:
        yield sse.event(e.body())
    finally:
        generation.abort()
    yield sse.DONE

