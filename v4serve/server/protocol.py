"""Request bodies of `/v1/completions` and `/v1/chat/completions`: parsed and checked field by field.

Every error is an `APIError` whose message starts with the field's name and whose `param` is
that name, so a client sees exactly what to fix. A field this server does not know, or knows but
cannot honour, is refused (400 naming it), never ignored; `user` is accepted (an end-user id for
the operator's logs, OpenAI's meaning).
Every string of the body is valid Unicode and the nesting is bounded (json_body.py); `tools`
are checked as JSON Schemas (tool_schemas.py).
Checks that need the prompt (its length against the context) happen later, in
`serving.check_prompt` / `serving.sampling_params` (and `ServingContext.tokenize`'s early length
refusal).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any

from v4serve.engine.sampling_params import StructuredOutputsParams
from v4serve.server.errors import APIError, bad_field
from v4serve.server.json_body import parse_json_body, parse_json_text
from v4serve.server.tool_schemas import check_tools

MAX_BODY_BYTES = 8 * 2**20  # default request body limit
MAX_LOGPROBS = 20  # top logprobs per position
MAX_N = 16  # choices per request
MAX_STOP = 16  # stop strings per request
# `seed` is a signed 64-bit integer (as in OpenAI's API); choice i samples with seed + i, which
# still fits torch's generator seeds, [-2**63, 2**64).
MIN_SEED, MAX_SEED = -2**63, 2**63 - 1
REASONING_EFFORTS = {"low": "high", "medium": "high", "high": "high", "max": "max"}
LOGIT_BIAS_LIMIT = 100.0  # biases are clamped to [-100, 100] (OpenAI's range, as vLLM does)
GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
_COMMON_FIELDS = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "n",
    "ignore_eos", "min_tokens", "stream", "stream_options", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logit_bias", "skip_special_tokens", "prompt_logprobs", "logprobs", "user", *GUIDED,
    "structured_outputs",
}
STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")
COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "echo", "suffix", "best_of"}
CHAT_FIELDS = _COMMON_FIELDS | {
    "messages", "tools", "tool_choice", "response_format", "top_logprobs", "reasoning_effort", "thinking",
    "chat_template_kwargs", "max_completion_tokens", "parallel_tool_calls",
}


def parse_body(raw: bytes) -> dict[str, Any]:
    """A JSON object from raw request bytes: strict UTF-8, nesting and code points checked
    (json_body.py)."""
    return parse_json_body(raw)


class Fields:
    """Typed access to a body's optional fields; each getter checks and names the field."""

    def __init__(self, body: dict[str, Any]):
        self.body = body

    def get(self, name: str, default: Any = None) -> Any:
        value = self.body.get(name)
        return default if value is None else value

    def integer(self, name: str, default: int | None, lo: int | None = None, hi: int | None = None) -> int | None:
        value = self.get(name, default)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad_field(name, f"expected an integer, got {_kind(value)}")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            rule = f"must be in [{lo}, {hi}]" if hi is not None else f"must be >= {lo}"
            raise bad_field(name, f"{rule}, got {value}")
        return value

    def number(self, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
        value = self.get(name, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            raise bad_field(name, f"expected a number, got {_kind(value)}")
        if value > hi or value < lo or (lo_open and value == lo):
            raise bad_field(name, f"must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            raise bad_field(name, f"expected true or false, got {_kind(value)}")
        return value

    def string(self, name: str, default: str | None = None) -> str | None:
        value = self.get(name, default)
        if value is not None and not isinstance(value, str):
            raise bad_field(name, f"expected a string, got {_kind(value)}")
        return value

    def obj(self, name: str) -> dict[str, Any]:
        value = self.get(name, {})
        if not isinstance(value, dict):
            raise bad_field(name, f"expected an object, got {_kind(value)}")
        return value

    def known(self, fields: set[str]) -> None:
        """Refuse the first field outside `fields` (so nothing a client asks for is ignored)."""
        for name in self.body:
            if name not in fields:
                raise bad_field(name, "is not supported by this server")

    def unsupported(self, name: str, allowed: Any) -> None:
        """Refuse a field unless it is absent or has its neutral value."""
        value = self.body.get(name)
        if value is not None and value != allowed:
            raise bad_field(name, f"is not supported by this server (only {json.dumps(allowed)})")


@dataclass(frozen=True)
class Sampling:
    """The sampling fields common to both endpoints, before the prompt is known."""

    max_tokens: int | None  # None: fill the context
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str]
    n: int
    ignore_eos: bool
    min_tokens: int
    stream: bool
    include_usage: bool
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    stop_token_ids: tuple[int, ...] = ()
    skip_special_tokens: bool = True
    prompt_logprobs: int | None = None
    structured: StructuredOutputsParams | None = None  # guided_* (or, on chat, response_format)
    structured_field: str | None = None  # the request field that asked for it


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[str | list[int]]
    sampling: Sampling
    logprobs: int | None


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[Any]
    tools: list[Any] | None
    parse_tools: bool  # tool_choice != "none"
    thinking_mode: str  # "chat" | "thinking"
    reasoning_effort: str | None
    sampling: Sampling
    logprobs: int | None  # None: no logprobs; k: top-k alternatives per token
    tool_choice: Any = "auto"  # "auto" | "none" | "required" | {"type": "function", "function": {"name": ...}}


def parse_completion_request(body: dict[str, Any]) -> CompletionRequest:
    f = Fields(body)
    f.known(COMPLETION_FIELDS)
    for name, neutral in (("echo", False), ("suffix", None), ("best_of", 1)):
        f.unsupported(name, neutral)
    return CompletionRequest(
        model=f.string("model"),
        prompts=_prompts(body.get("prompt")),
        sampling=_sampling(f, default_max_tokens=16),
        logprobs=f.integer("logprobs", None, 0, MAX_LOGPROBS),
    )


def parse_chat_request(body: dict[str, Any]) -> ChatRequest:
    f = Fields(body)
    f.known(CHAT_FIELDS)
    f.unsupported("parallel_tool_calls", True)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_field("messages", "expected a non-empty list of messages")
    tool_choice = f.get("tool_choice", "auto")
    tools = f.get("tools")
    if tools is not None:
        check_tools(tools, "tools")
    _check_messages_json(messages)
    _check_tool_choice(tool_choice, tools)
    want_logprobs = f.boolean("logprobs", False)
    top_logprobs = f.integer("top_logprobs", 0, 0, MAX_LOGPROBS)
    if top_logprobs and not want_logprobs:
        raise bad_field("top_logprobs", "needs logprobs: true")
    effort = f.string("reasoning_effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad_field("reasoning_effort", f"expected one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
    use_tools = bool(tools) and tool_choice != "none"
    sampling = _sampling(f, default_max_tokens=None)
    response_format = _response_format(f.obj("response_format"))
    if response_format is not None:
        if sampling.structured is not None:
            raise bad_field("response_format", f"cannot be combined with {sampling.structured_field}")
        sampling = replace(sampling, structured=response_format, structured_field="response_format")
    if sampling.structured is not None and tool_choice not in ("auto", "none"):
        raise bad_field("tool_choice", f"cannot be combined with {sampling.structured_field}")
    if _thinking(f) and (sampling.structured is not None or tool_choice not in ("auto", "none")):
        field = sampling.structured_field or "tool_choice"
        raise bad_field(field, "is not supported with thinking enabled (it would constrain the reasoning)")
    return ChatRequest(
        model=f.string("model"),
        messages=messages,
        tools=tools if use_tools else None,
        parse_tools=use_tools,
        thinking_mode="thinking" if _thinking(f) else "chat",
        reasoning_effort=REASONING_EFFORTS.get(effort) if effort else None,
        sampling=sampling,
        logprobs=top_logprobs if want_logprobs else None,
        tool_choice=tool_choice,
    )


def _check_messages_json(messages: list[Any]) -> None:
    """What the chat encoder does not check: tools given on a message (their schemas and names)
    and tool-call `arguments` strings (a JSON document of their own: nesting, code points)."""
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            continue  # the encoder names it
        if m.get("tools") is not None:
            check_tools(m["tools"], f"messages[{i}].tools")
        calls = m.get("tool_calls")
        for j, call in enumerate(calls if isinstance(calls, list) else []):
            fn = call.get("function") if isinstance(call, dict) else None
            arguments = fn.get("arguments") if isinstance(fn, dict) else None
            if isinstance(arguments, str):
                parse_json_text(arguments, f"messages[{i}].tool_calls[{j}].function.arguments")


def check_fan_out(num_prompts: int, n: int, limit: int, param: str) -> None:
    """At most `limit` sequences (prompts x n) per request: one request must not flood the queue."""
    if num_prompts * n > limit:
        shape = f"{num_prompts} prompts x n={n}" if num_prompts > 1 else f"n={n}"
        raise APIError(
            f"{param}: {shape} makes {num_prompts * n} sequences, more than this server's limit of {limit} "
            f"sequences per request (--max-seqs-per-request)", param=param, code="too_many_sequences")


def _check_tool_choice(tool_choice: Any, tools: Any) -> None:
    if tool_choice in ("auto", "none"):
        return
    if tool_choice == "required" or isinstance(tool_choice, dict):
        if not tools:
            raise bad_field("tool_choice", f"{json.dumps(tool_choice)} needs a non-empty tools list")
    if tool_choice == "required":
        return
    name = tool_choice.get("function", {}).get("name") if isinstance(tool_choice, dict) else None
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(name, str)):
        raise bad_field("tool_choice", "expected 'auto', 'none', 'required' or "
                        f'{{"type": "function", "function": {{"name": ...}}}}, got {json.dumps(tool_choice)}')
    names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
    if name not in names:
        raise bad_field("tool_choice.function.name", f"{name!r} is not one of the tools ({', '.join(map(str, names))})")


def _response_format(fmt: dict[str, Any]) -> StructuredOutputsParams | None:
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind != "json_schema":
        raise bad_field("response_format.type", f"expected 'text', 'json_object' or 'json_schema', got {json.dumps(kind)}")
    spec = fmt.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        raise bad_field("response_format.json_schema.schema", "expected a JSON schema object")
    return _checked(StructuredOutputsParams, dict(json=schema), "response_format.json_schema.schema")


def _structured(f: Fields) -> tuple[StructuredOutputsParams | None, str | None]:
    """vLLM's guided_json / guided_regex / guided_choice / guided_grammar, or its newer
    `structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object": ...}`: at most one."""
    given = [name for name in (*GUIDED, "structured_outputs") if f.body.get(name) is not None]
    if not given:
        return None, None
    if len(given) > 1:
        raise bad_field(given[1], f"cannot be combined with {given[0]}")
    name = given[0]
    value = f.body[name]
    if name == "structured_outputs":
        spec = f.obj(name)
        unknown = [k for k in spec if k not in STRUCTURED_KEYS]
        if unknown:
            raise bad_field(f"{name}.{unknown[0]}", "is not supported by this server")
        set_keys = [k for k in STRUCTURED_KEYS if spec.get(k) not in (None, False)]
        if len(set_keys) != 1:
            raise bad_field(name, f"needs exactly one of {', '.join(STRUCTURED_KEYS)}")
        field = f"{name}.{set_keys[0]}"
        return _checked(StructuredOutputsParams, {set_keys[0]: spec[set_keys[0]]}, field), field
    if name == "guided_json" and not isinstance(value, (dict, str)):
        raise bad_field(name, f"expected a JSON schema (an object or its JSON text), got {_kind(value)}")
    return _checked(StructuredOutputsParams, {GUIDED[name]: value}, name), name


def _checked(make, kwargs: dict, field: str):
    """`make(**kwargs)` and a compile check of the constraint; a ValueError becomes a 400 naming `field`."""
    from v4serve.engine.structured_output import check_structured_outputs

    try:
        params = make(**kwargs)
        check_structured_outputs(params, field)
    except ValueError as e:
        message = str(e)
        raise bad_field(field, message[len(field) + 2:] if message.startswith(field + ":") else message) from None
    return params


def _logit_bias(value: Any) -> dict[int, float] | None:
    """OpenAI's {"token id": bias}: keys are token ids as strings (or integers), biases clamped to [-100, 100]."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise bad_field("logit_bias", f"expected an object of token id -> bias, got {_kind(value)}")
    out = {}
    for key, bias in value.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise bad_field("logit_bias", f"keys must be token ids, got {json.dumps(key)}") from None
        if token < 0:
            raise bad_field("logit_bias", f"token ids must be >= 0, got {token}")
        if not isinstance(bias, (int, float)) or isinstance(bias, bool) or bias != bias:
            raise bad_field("logit_bias", f"bias of token {token} must be a number, got {_kind(bias)}")
        out[token] = max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(bias)))
    return out


def _thinking(f: Fields) -> bool:
    """DeepSeek's `thinking: {"type": ...}` or the `chat_template_kwargs.thinking` switch."""
    thinking = f.obj("thinking")
    kind = thinking.get("type", "disabled")
    if kind not in ("enabled", "disabled"):
        raise bad_field("thinking.type", f"expected 'enabled' or 'disabled', got {json.dumps(kind)}")
    kwargs = f.obj("chat_template_kwargs")
    switch = kwargs.get("thinking", kwargs.get("enable_thinking"))
    if switch is not None and not isinstance(switch, bool):
        raise bad_field("chat_template_kwargs.thinking", f"expected true or false, got {_kind(switch)}")
    return bool(switch) if switch is not None else kind == "enabled"


def _sampling(f: Fields, default_max_tokens: int | None) -> Sampling:
    structured, structured_field = _structured(f)
    stop_token_ids = f.get("stop_token_ids", [])
    if not isinstance(stop_token_ids, list) or not all(_is_token(t) and t >= 0 for t in stop_token_ids):
        raise bad_field("stop_token_ids", "expected a list of non-negative token ids")
    prompt_logprobs = f.integer("prompt_logprobs", None, 0, MAX_LOGPROBS)
    if prompt_logprobs is not None and f.get("stream", False) is True:
        raise bad_field("prompt_logprobs", "is not supported with stream: true")
    max_tokens = f.integer("max_completion_tokens", None, 1)
    if max_tokens is None:
        max_tokens = f.integer("max_tokens", default_max_tokens, 1)
    stream = f.boolean("stream", False)
    options = f.obj("stream_options")
    if options and not stream:
        raise bad_field("stream_options", "is only allowed with stream: true")
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad_field("stream_options.include_usage", f"expected true or false, got {_kind(include_usage)}")
    min_tokens = f.integer("min_tokens", 0, 0)
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_field("min_tokens", f"({min_tokens}) exceeds max_tokens ({max_tokens})")
    return Sampling(
        max_tokens=max_tokens,
        temperature=f.number("temperature", 1.0, 0.0, 2.0),
        top_p=f.number("top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=f.integer("top_k", -1, -1),
        seed=f.integer("seed", None, MIN_SEED, MAX_SEED),
        stop=_stop(f.get("stop")),
        n=f.integer("n", 1, 1, MAX_N),
        ignore_eos=f.boolean("ignore_eos", False),
        min_tokens=min_tokens,
        stream=stream,
        include_usage=include_usage,
        min_p=f.number("min_p", 0.0, 0.0, 1.0),
        presence_penalty=f.number("presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=f.number("frequency_penalty", 0.0, -2.0, 2.0),
        repetition_penalty=f.number("repetition_penalty", 1.0, 0.0, float("inf"), lo_open=True),
        logit_bias=_logit_bias(f.get("logit_bias")),
        stop_token_ids=tuple(stop_token_ids),
        skip_special_tokens=f.boolean("skip_special_tokens", True),
        prompt_logprobs=prompt_logprobs,
        structured=structured,
        structured_field=structured_field,
    )


def _stop(value: Any) -> list[str]:
    stops = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_field("stop", "expected a non-empty string or a list of non-empty strings")
    if len(stops) > MAX_STOP:
        raise bad_field("stop", f"at most {MAX_STOP} stop strings, got {len(stops)}")
    return stops


def _prompts(value: Any) -> list[str | list[int]]:
    """OpenAI's prompt forms: a string, a list of strings, token ids, or a list of token-id lists."""
    if isinstance(value, str):
        prompts = [value]
    elif isinstance(value, list) and value and all(_is_token(t) for t in value):
        prompts = [value]
    elif isinstance(value, list) and value:
        prompts = value
    else:
        raise bad_field("prompt", "expected a non-empty string, list of strings, or list of token ids")
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p:
                raise bad_field(f"prompt[{i}]" if len(prompts) > 1 else "prompt", "must not be empty")
        elif not (isinstance(p, list) and p and all(_is_token(t) for t in p)):
            raise bad_field(f"prompt[{i}]", "expected a non-empty string or a non-empty list of token ids")
    return prompts


def _is_token(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


def _kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), json.dumps(value) if isinstance(value, (int, float)) else type(value).__name__)
