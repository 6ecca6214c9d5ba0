"""Tool calls, reasoning and malformed DSML over the API, with the scripted model (conftest.SCRIPT)."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from server_harness import WEATHER_CALL

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


def _stream(client: OpenAI, **kwargs):
    """Add up a chat stream the way a client does: (content, reasoning, tool calls, finish reason)."""
    content, reasoning, calls, finish = "", "", {}, None
    for chunk in client.chat.completions.create(model="scripted", stream=True, **kwargs):
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                entry["name"] += call.function.name or ""
                entry["arguments"] += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return content, reasoning, [calls[i] for i in sorted(calls)], finish


def test_tool_call_non_streamed(client):
    r = client.chat.completions.create(model="scripted", messages=ASK, tools=TOOLS, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "days": 3}
    assert call.id.startswith("call_")


def test_tool_call_streamed(client):
    content, _, calls, finish = _stream(client, messages=ASK, tools=TOOLS, max_tokens=200)
    assert finish == "tool_calls"
    assert content == "Let me check."
    assert [c["name"] for c in calls] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 3}


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
    streamed = _stream(client, messages=history, tools=TOOLS, max_tokens=200)
    assert streamed == ("It is sunny in Paris for the next 3 days.", "", [], "stop")


@pytest.mark.parametrize("stream", [False, True])
def test_malformed_dsml_comes_back_as_content(client, stream):
    messages = [{"role": "user", "content": "a broken call please"}]
    if stream:
        content, _, calls, finish = _stream(client, messages=messages, tools=TOOLS, max_tokens=200)
    else:
        r = client.chat.completions.create(model="scripted", messages=messages, tools=TOOLS, max_tokens=200)
        content, calls, finish = r.choices[0].message.content, r.choices[0].message.tool_calls or [], \
            r.choices[0].finish_reason
    assert finish == "stop" and not calls
    assert content.startswith("Calling.\n\n<｜DSML｜tool_calls>") and "three" in content


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
    content, reasoning, _, _ = _stream(client, messages=messages, max_tokens=100, extra_body=switch)
    assert (reasoning, content) == ("The user wants a number.", "42")


def test_chat_mode_keeps_think_tag_as_content(client):
    r = client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "ponder"}],
                                       max_tokens=100)
    assert r.choices[0].message.content == "The user wants a number.</think>42"
