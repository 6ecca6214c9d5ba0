"""Structured outputs, sampling fields and their refusals on the real server (tiny, CPU): vLLM's
guided_* fields on both endpoints, response_format and tool_choice on chat, prompt_logprobs,
logit_bias; every unsupported field a 400 that names it."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from openai import OpenAI

from v4serve.chat import parse_completion

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "Give me a record."}]
SCHEMA = {"type": "object", "properties": {
    "ok": {"type": "boolean"},
    "inner": {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer",
                                                                                "minimum": 0, "maximum": 9}},
              "required": ["kind", "n"], "additionalProperties": False}},
    "required": ["ok", "inner"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]


def _valid(value) -> bool:
    return (isinstance(value, dict) and set(value) == {"ok", "inner"} and isinstance(value["ok"], bool)
            and set(value["inner"]) == {"kind", "n"} and value["inner"]["kind"] in ("a", "b")
            and isinstance(value["inner"]["n"], int) and 0 <= value["inner"]["n"] <= 9)


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def test_guided_json_on_completions_with_n(server):
    r = _post(server, COMPLETIONS, {"prompt": "Record:", "max_tokens": 40, "n": 3, "temperature": 1.0, "seed": 3,
                                    "guided_json": SCHEMA})
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        assert _valid(json.loads(choice["text"])), choice["text"]


def test_response_format_json_schema_with_the_openai_client(server):
    client = OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)
    out = client.chat.completions.create(
        model="tiny", messages=USER, max_tokens=40, temperature=0.0,
        response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}})
    assert _valid(json.loads(out.choices[0].message.content)), out.choices[0].message.content
    out = client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, temperature=0.0,
                                         response_format={"type": "json_object"})
    assert out.choices[0].message.content.lstrip()[:1] in ("{", "[")


def test_guided_regex_and_choice(server):
    r = _post(server, COMPLETIONS, {"prompt": "Code:", "max_tokens": 12, "temperature": 1.0, "seed": 1,
                                    "guided_regex": "[A-Z]{2}[0-9]{2}"})
    assert r.status_code == 200 and re.fullmatch("[A-Z]{2}[0-9]{2}", r.json()["choices"][0]["text"]), r.text
    whole = r.json()["choices"][0]["text"]
    r = _post(server, CHAT, {"messages": USER, "max_tokens": 12, "n": 2, "temperature": 1.0,
                             "guided_choice": ["left", "right"]})
    assert r.status_code == 200, r.text
    assert {c["message"]["content"] for c in r.json()["choices"]} <= {"left", "right"}
    r = _post(server, COMPLETIONS, {"prompt": "Code:", "max_tokens": 12, "temperature": 1.0, "seed": 1,
                                    "guided_regex": "[A-Z]{2}[0-9]{2}", "stream": True})
    streamed = "".join(json.loads(line[6:])["choices"][0]["text"] for line in r.text.splitlines()
                       if line.startswith("data: {") and json.loads(line[6:])["choices"])
    assert streamed == whole, r.text  # the same seed streamed
    r = _post(server, CHAT, {"messages": USER, "max_tokens": 12, "n": 2, "temperature": 1.0,
                             "structured_outputs": {"choice": ["left", "right"]}})
    assert r.status_code == 200, r.text
    assert {c["message"]["content"] for c in r.json()["choices"]} <= {"left", "right"}


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_tool_choice_required_and_named_give_well_formed_calls(server, tool_choice):
    r = _post(server, CHAT, {"messages": USER, "tools": TOOLS, "tool_choice": tool_choice, "max_tokens": 120,
                             "temperature": 0.0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["parse_error"] is None and choice["finish_reason"] == "tool_calls", choice
    calls = choice["message"]["tool_calls"]
    assert calls and all(c["function"]["name"] in ("get_weather", "ping") for c in calls)
    if isinstance(tool_choice, dict):
        assert [c["function"]["name"] for c in calls] == ["get_weather"]
        arguments = json.loads(calls[0]["function"]["arguments"])
        assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 8
        assert arguments.get("days", 1) in range(1, 15)


def test_prompt_logprobs_and_logit_bias(server):
    r = _post(server, COMPLETIONS, {"prompt": [5, 6, 7, 8], "max_tokens": 3, "temperature": 0.0,
                                    "prompt_logprobs": 2, "logit_bias": {"77": 100}, "presence_penalty": 0.5})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lps = choice["prompt_logprobs"]
    assert len(lps) == 4 and lps[0] is None
    for position, token in zip(lps[1:], (6, 7, 8)):
        assert str(token) in position and 2 <= len(position) <= 3
        assert all(entry["logprob"] <= 0 and entry["rank"] >= 1 for entry in position.values())
    chat = _post(server, CHAT, {"messages": USER, "max_tokens": 1, "prompt_logprobs": 0})
    assert chat.status_code == 200, chat.text
    lps = chat.json()["prompt_logprobs"]  # top level on chat, as vLLM has it
    assert lps[0] is None and len(lps) > 3 and all(len(p) == 1 for p in lps[1:])
    r2 = _post(server, COMPLETIONS, {"prompt": [5, 6, 7, 8], "max_tokens": 3, "temperature": 0.0,
                                     "logit_bias": {"77": 100}, "return_tokens_as_token_ids": True})
    assert r2.status_code == 400 and r2.json()["error"]["param"] == "return_tokens_as_token_ids"


BAD = [
    (COMPLETIONS, {"prompt": "x", "min_p": 2}, "min_p"),
    (COMPLETIONS, {"prompt": "x", "presence_penalty": 5}, "presence_penalty"),
    (COMPLETIONS, {"prompt": "x", "repetition_penalty": 0}, "repetition_penalty"),
    (COMPLETIONS, {"prompt": "x", "frobnicate": 1}, "frobnicate"),
    (COMPLETIONS, {"prompt": "x", "use_beam_search": True}, "use_beam_search"),
    (COMPLETIONS, {"prompt": "x", "guided_regex": "(unclosed"}, "guided_regex"),
    (COMPLETIONS, {"prompt": "x", "guided_json": {"type": "object"}, "guided_regex": "a"}, "guided_regex"),
    (COMPLETIONS, {"prompt": "x", "guided_json": 5}, "guided_json"),
    (COMPLETIONS, {"prompt": "x", "guided_choice": []}, "guided_choice"),
    (COMPLETIONS, {"prompt": "x", "guided_grammar": "root ::= "}, "guided_grammar"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"999999999": 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "logit_bias": {"abc": 1}}, "logit_bias"),
    (COMPLETIONS, {"prompt": "x", "stop_token_ids": [-1]}, "stop_token_ids"),
    (COMPLETIONS, {"prompt": "x", "prompt_logprobs": 1, "stream": True}, "prompt_logprobs"),
    (COMPLETIONS, {"prompt": "x", "prompt_logprobs": 99}, "prompt_logprobs"),
    (COMPLETIONS, {"prompt": "x", "structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    (COMPLETIONS, {"prompt": "x", "structured_outputs": {"structural_tag": "a"}}, "structured_outputs.structural_tag"),
    (COMPLETIONS, {"prompt": "x", "structured_outputs": {"regex": "("}}, "structured_outputs.regex"),
    (CHAT, {"messages": USER, "response_format": {"type": "xml"}}, "response_format.type"),
    (CHAT, {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {}}},
     "response_format.json_schema.schema"),
    (CHAT, {"messages": USER, "response_format": {"type": "json_object"}, "guided_regex": "a"}, "response_format"),
    (CHAT, {"messages": USER, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    (CHAT, {"messages": USER, "tools": TOOLS, "tool_choice": "required", "guided_regex": "a"}, "tool_choice"),
    (CHAT, {"messages": USER, "tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
    (CHAT, {"messages": USER, "response_format": {"type": "json_object"}, "thinking": {"type": "enabled"}},
     "response_format"),
    (CHAT, {"messages": USER, "parallel_tool_calls": False}, "parallel_tool_calls"),
    (CHAT, {"messages": USER, "function_call": "auto"}, "function_call"),
]


@pytest.mark.parametrize("path, body, param", BAD, ids=[b[2] + str(i) for i, b in enumerate(BAD)])
def test_unsupported_or_bad_fields_get_a_400_naming_them(server, path, body, param):
    r = _post(server, path, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"].startswith(param), error


def test_the_dsml_grammar_accepts_what_the_parser_reads():
    """The grammar against the block renderer (chat/dsml.py): a rendered call is in the language,
    and what the language holds parses back."""
    xgr = pytest.importorskip("xgrammar")
    from v4serve.chat.dsml import render_tool_calls
    from v4serve.engine.structured_output_dsml import tool_call_grammar

    text = render_tool_calls([("get_weather", {"city": "Oslo", "days": 3}), ("ping", {})])
    vocab = sorted(set(text) | set("abc"))
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo(vocab, vocab_size=len(vocab)), max_threads=1)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(tool_call_grammar(TOOLS)))
    assert matcher.accept_string(text) and matcher.is_completed()
    named = xgr.GrammarMatcher(compiler.compile_grammar(tool_call_grammar(TOOLS, "ping")))
    assert not named.accept_string(text[:40])  # another tool's name is outside the named grammar
    parsed = parse_completion(text, "chat", {"get_weather", "ping"})
    assert parsed.error is None and [c["function"]["name"] for c in parsed.tool_calls] == ["get_weather", "ping"]


def test_the_dsml_grammar_holds_a_parameter_to_its_schema():
    """Values written as JSON keep to their schema: an integer parameter takes no object or string,
    a short minimum..maximum range only its values, an enum only its members (a raw string's too)."""
    xgr = pytest.importorskip("xgrammar")
    from v4serve.chat.dsml import render_tool_calls
    from v4serve.engine.structured_output_dsml import tool_call_grammar

    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "unit": {"type": "string", "enum": ["c", "f"]}, "n": {"type": "integer"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}, "ok": {"type": "boolean"}}}}}]
    texts = {render_tool_calls([("f", args)]): ok for args, ok in [
        ({"unit": "c", "n": -12, "days": 14, "ok": True}, True), ({"n": 0}, True),
        ({"unit": "k"}, False), ({"n": {"a": 1}}, False), ({"n": "7"}, False), ({"n": 1.5}, False),
        ({"days": 15}, False), ({"days": 0}, False), ({"ok": 1}, False)]}
    vocab = sorted(set("".join(texts)))
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo(vocab, vocab_size=len(vocab)), max_threads=1)
    grammar = compiler.compile_grammar(tool_call_grammar(tools))
    for text, ok in texts.items():
        matcher = xgr.GrammarMatcher(grammar)
        assert (matcher.accept_string(text) and matcher.is_completed()) == ok, text
