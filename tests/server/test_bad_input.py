"""Bad requests get a 4xx in OpenAI's error shape naming the field, while a good request that runs
at the same time completes exactly as it would alone, and the server stays healthy."""

from __future__ import annotations

import json
import threading

import httpx

from v4serve import LLM, SamplingParams

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
USER = [{"role": "user", "content": "hi"}]


def _json(body) -> bytes:
    return json.dumps(body).encode()


OVERSIZED = b'{"prompt": "' + b"a" * (9 * 2**20) + b'"}'  # over the default limit of 8 MiB
OVERSIZED_CHUNKS = [OVERSIZED[i:i + 2**20] for i in range(0, len(OVERSIZED), 2**20)]

# (endpoint, raw body, status, param, code or None); a list of chunks is sent chunked, without a
# content-length, so the server finds it too large only while reading it.
BAD = [
    (COMPLETIONS, b'{"prompt": "x", "max_tokens": ', 400, "body", None),
    (COMPLETIONS, b'[1, 2, 3]', 400, "body", None),
    (COMPLETIONS, b'{"prompt": "\xff\xfe caf\xe9"}', 400, "body", None),
    (COMPLETIONS, _json({"max_tokens": 3}), 400, "prompt", None),
    (COMPLETIONS, _json({"prompt": 123}), 400, "prompt", None),
    (COMPLETIONS, _json({"prompt": ""}), 400, "prompt", None),
    (COMPLETIONS, _json({"prompt": [0, 999999999]}), 400, "prompt", None),
    (COMPLETIONS, _json({"prompt": "x", "max_tokens": "10"}), 400, "max_tokens", None),
    (COMPLETIONS, _json({"prompt": "x", "max_tokens": -5}), 400, "max_tokens", None),
    (COMPLETIONS, _json({"prompt": "x", "max_tokens": 10**12}), 400, "max_tokens", "context_length_exceeded"),
    (COMPLETIONS, _json({"prompt": "hello " * 5000, "max_tokens": 1}), 400, "prompt", "context_length_exceeded"),
    (COMPLETIONS, _json({"prompt": "x", "temperature": "hot"}), 400, "temperature", None),
    (COMPLETIONS, _json({"prompt": "x", "top_p": 0}), 400, "top_p", None),
    (COMPLETIONS, _json({"prompt": "x", "n": 0}), 400, "n", None),
    (COMPLETIONS, _json({"prompt": "x", "stop": [""]}), 400, "stop", None),
    (COMPLETIONS, _json({"prompt": "x", "logprobs": 99}), 400, "logprobs", None),
    (COMPLETIONS, _json({"prompt": "x", "stream": "yes"}), 400, "stream", None),
    (COMPLETIONS, _json({"prompt": "x", "stream_options": {"include_usage": True}}), 400, "stream_options", None),
    (COMPLETIONS, _json({"prompt": "x", "max_tokens": 2, "min_tokens": 5}), 400, "min_tokens", None),
    (COMPLETIONS, _json({"prompt": "x", "seed": 2**70}), 400, "seed", None),
    (COMPLETIONS, _json({"prompt": "x", "seed": -2**63 - 1}), 400, "seed", None),
    (COMPLETIONS, _json({"prompt": "x", "model": "gpt-4"}), 404, "model", "model_not_found"),
    (COMPLETIONS, OVERSIZED, 413, "body", "request_too_large"),
    (COMPLETIONS, OVERSIZED_CHUNKS, 413, "body", "request_too_large"),
    (CHAT, _json({"messages": []}), 400, "messages", None),
    (CHAT, _json({"model": "tiny"}), 400, "messages", None),
    (CHAT, _json({"messages": [{"role": "wizard", "content": "x"}]}), 400, "messages[0].role", None),
    (CHAT, _json({"messages": [{"role": "user", "content": 5}]}), 400, "messages[0].content", None),
    (CHAT, _json({"messages": USER, "tool_choice": "required", "tools": []}), 400, "tool_choice", None),
    (CHAT, _json({"messages": USER, "tools": [{"type": "function"}]}), 400, "tools[0].function", None),
    (CHAT, _json({"messages": USER, "thinking": {"type": "maybe"}}), 400, "thinking.type", None),
    (CHAT, _json({"messages": USER, "reasoning_effort": "extreme"}), 400, "reasoning_effort", None),
    (CHAT, _json({"messages": USER, "top_logprobs": 2}), 400, "top_logprobs", None),
    (CHAT, _json({"messages": USER, "max_completion_tokens": 0}), 400, "max_completion_tokens", None),
    (CHAT, _json({"messages": USER, "presence_penalty": 5}), 400, "presence_penalty", None),
    (CHAT, _json({"messages": USER, "seed": 2**64}), 400, "seed", None),
]


def _check(response: httpx.Response, status: int, param: str, code: str | None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["message"].startswith(param)
    if code is not None:
        assert error["code"] == code


def test_bad_inputs_while_a_good_request_runs(server):
    max_tokens = 60
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    expected = LLM("tiny", device="cpu").generate(["A good request"], params)
    good: dict = {}
    started = threading.Event()

    def run_good() -> None:
        body = {"model": "tiny", "prompt": "A good request", "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}
        text = ""
        with httpx.stream("POST", server.url + COMPLETIONS, json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    text += "".join(c["text"] for c in chunk["choices"])
                    good["usage"] = chunk.get("usage") or good.get("usage")
                started.set()
        good["text"] = text

    thread = threading.Thread(target=run_good)
    thread.start()
    with httpx.Client(base_url=server.url, timeout=30) as http:
        assert started.wait(60)
        for endpoint, body, status, param, code in BAD:
            _check(http.post(endpoint, content=body, headers={"content-type": "application/json"}),
                   status, param, code)
        bad_done_while_running = thread.is_alive()
        assert http.get("/health").status_code == 200
    thread.join(120)
    assert bad_done_while_running, "the good request finished before the bad ones: the test proves nothing"
    assert good["text"] == expected[0].outputs[0].text
    assert good["usage"]["completion_tokens"] == max_tokens


def test_unknown_route_is_openai_shaped(server):
    r = httpx.get(server.url + "/v1/nothing")
    assert r.status_code == 404 and set(r.json()["error"]) == {"message", "type", "param", "code"}
