"""Tool calls, reasoning and malformed DSML over the API, with the scripted model (conftest.SCRIPT)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from openai import OpenAI

from server_harness import WEATHER_CALL
from v4serve.chat import encode_messages
from v4serve.tokenizer import Tokenizer

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather forecast for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city"]},
    },
}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def client(scripted_server) -> OpenAI:
    return OpenAI(base_url=scripted_server.url + "/v1", api_key="none", max_retries=0, timeout=60)


@dataclass
class Streamed:
    """One choice's chat stream, added up the way a client does."""
    id: str = ""
    content: str = ""
    reasoning: str = ""
    calls: list[dict] = field(default_factory=list)
    finish: str | None = None
    parse_error: str | None = None  # from the chunk that carries the finish reason


def _stream(client: OpenAI, **kwargs) -> Streamed:
    out, calls = Streamed(), {}
    for chunk in client.chat.completions.create(model="scripted", stream=True, **kwargs):
        out.id = chunk.id
        for choice in chunk.choices:
            delta = choice.delta
            out.content += delta.content or ""
            out.reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            if choice.finish_reason:
                out.finish, out.parse_error = choice.finish_reason, choice.model_extra["parse_error"]
    out.calls = [calls[i] for i in sorted(calls)]
    return out


def test_tool_call_non_streamed(client):
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert call.id.startswith("call_")
    assert choice.model_extra["parse_error"] is None


def test_tool_call_streamed(client):
    s = _stream(client, messages=ASK, tools=TOOLS, max_tokens=200)
    assert (s.finish, s.content, s.parse_error) == ("tool_calls", "Let me check.", None)
    assert [c["name"] for c in s.calls] == ["get_weather"]
    assert json.loads(s.calls[0]["arguments"]) == {"city": "Paris", "days": 3}


def test_multi_turn_tool_conversation(client):
    first = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, max_tokens=200)
    message = first.choices[0].message
    call = message.tool_calls[0]
    history = ASK + [
        {"role": "assistant", "content": message.content,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 24C"},
    ]
    second = client.chat.completions.create(model="scripted", messages=history, tools=TOOLS, max_tokens=200)
    assert second.choices[0].finish_reason == "stop"
    assert second.choices[0].message.content == "It is sunny in Paris for the next 3 days."
    assert not second.choices[0].message.tool_calls
    s = _stream(client, messages=history, tools=TOOLS, max_tokens=200)
    assert (s.content, s.reasoning, s.calls, s.finish) == ("It is sunny in Paris for the next 3 days.", "", [], "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_dsml_comes_back_as_content(scripted_server, client, stream):
    """A 200 with the text as content, and the reason both in `parse_error` and in the server log."""
    messages = [{"role": "user", "content": "a broken call please"}]
    if stream:
        s = _stream(client, messages=messages, tools=TOOLS, max_tokens=200)
        request_id, content, calls, finish, error = s.id, s.content, s.calls, s.finish, s.parse_error
    else:
        r = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, max_tokens=200)
        choice = r.choices[0]
        request_id, content, calls, finish = r.id, choice.message.content, choice.message.tool_calls, \
            choice.finish_reason
        error = choice.model_extra["parse_error"]
    assert finish == "stop" and not calls
    assert content.startswith("Calling.\n\n<｜DSML｜tool_calls>") and "three" in content
    assert "'days'" in error and "not JSON" in error
    [line] = [line for line in scripted_server.log().splitlines() if request_id in line]
    assert line.startswith("WARNING:") and line.endswith(error)


def test_tool_choice_none_leaves_dsml_as_content(client):
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, tool_choice="none",
                                       max_tokens=200)
    assert not r.choices[0].message.tool_calls
    assert r.choices[0].message.content == WEATHER_CALL


@pytest.mark.parametrize("switch", [{"thinking": {"type": "enabled"}}, {"chat_template_kwargs": {"thinking": True}}])
def test_thinking_mode_splits_reasoning(client, switch):
    messages = [{"role": "user", "content": "ponder this"}]
    r = client.chat.completions.create(model="scripted", messages=messages, max_tokens=100, extra_body=switch)
    message = r.choices[0].message.model_dump()
    assert message["reasoning_content"] == "The user wants a number."
    assert message["content"] == "42"
    s = _stream(client, messages=messages, max_tokens=100, extra_body=switch)
    assert (s.reasoning, s.content) == ("The user wants a number.", "42")


@pytest.mark.parametrize("switch", [{}, {"thinking": {"type": "disabled"}},
                                    {"chat_template_kwargs": {"thinking": False}}])
def test_chat_mode_keeps_think_tag_as_content(client, switch):
    r = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "ponder"}],
                                       max_tokens=100, extra_body=switch)
    message = r.choices[0].message.model_dump()
    assert message["content"] == "The user wants a number.</think>42"
    assert message.get("reasoning_content") is None


def test_max_reasoning_effort_lengthens_the_prompt(client):
    """Only `max` adds its instruction (thinking mode); `high` is the trained default."""
    messages = [{"role": "user", "content": "ponder this"}]
    tokenizer = Tokenizer.for_model(None)

    def prompt_tokens(effort: str | None) -> int:
        r = client.chat.completions.create(model="scripted", messages=messages, max_tokens=100, reasoning_effort=effort,
                                           extra_body={"thinking": {"type": "enabled"}})
        return r.usage.prompt_tokens

    plain = len(tokenizer.encode(encode_messages(messages, "thinking")))
    longest = len(tokenizer.encode(encode_messages(messages, "thinking", reasoning_effort="max")))
    assert longest > plain
    assert [prompt_tokens(e) for e in (None, "high", "max")] == [plain, plain, longest]
