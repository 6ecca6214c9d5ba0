"""The real server (`v4serve serve --model tiny --device cpu`) driven by the official openai client:
completions and chat, whole and streamed, against `LLM.generate` / `LLM.chat` for the same prompts."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from v4serve import LLM, SamplingParams
from v4serve.chat import encode_messages

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(server) -> OpenAI:
    return OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM("tiny", device="cpu", max_num_seqs=8)


def greedy(max_tokens: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}


def test_completion_matches_llm_generate(client, llm):
    expected = llm.generate([PROMPT], greedy(8))[0]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.choices[0].text == expected.outputs[0].text
    assert r.choices[0].finish_reason == "length"
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(expected.prompt_token_ids), 8)
    assert r.id.startswith("cmpl-")

    chunks = list(client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected.outputs[0].text
    assert chunks[-1].usage.completion_tokens == 8 and not chunks[-1].choices
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_token_id_prompt(client, llm):
    expected = llm.generate(prompt_token_ids=[[0, 42, 7]], sampling_params=greedy(5))[0].outputs[0]
    r = client.completions.create(model="tiny", prompt=[0, 42, 7], max_tokens=5, temperature=0)
    assert r.choices[0].text == expected.text


def test_chat_matches_llm_chat(client, llm):
    expected = llm.chat(CHAT, greedy(6))[0]
    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, temperature=0)
    assert r.choices[0].message.content == expected.outputs[0].text
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(expected.prompt_token_ids)
    stream = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=6, temperature=0, stream=True)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected.outputs[0].text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_string_truncates(client, llm):
    text = llm.generate([PROMPT], greedy(8))[0].outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 2]
    want = text[:text.find(stop)]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, stop=[stop])
    assert (r.choices[0].text, r.choices[0].finish_reason) == (want, "stop")
    chunks = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=8, temperature=0, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in chunks) == want


def test_n_choices_with_seed_are_reproducible(client):
    kw = dict(model="tiny", prompt=PROMPT, max_tokens=5, temperature=1.0, n=3, seed=11)
    first, second = client.completions.create(**kw), client.completions.create(**kw)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert [c.text for c in first.choices] == [c.text for c in second.choices]
    assert len({c.text for c in first.choices}) > 1  # different seeds per choice
    assert first.usage.completion_tokens == 15


def test_chat_n_choices_count_the_prompt_once(client, llm):
    prompt_tokens = len(llm.tokenizer.encode(encode_messages(CHAT)))
    want = (prompt_tokens, 12, prompt_tokens + 12)  # 3 choices of 4 tokens
    kw = dict(model="tiny", messages=CHAT, max_tokens=4, n=3, seed=5, extra_body={"ignore_eos": True})
    r = client.chat.completions.create(**kw)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == want
    last = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))[-1]
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == want


def test_logprobs(client, llm):
    expected = llm.generate([PROMPT], greedy(4, logprobs=3))[0].outputs[0]
    r = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 4 and all(len(top) == 3 for top in lp.top_logprobs)
    want = [entry[t].logprob for t, entry in zip(expected.token_ids, expected.logprobs)]
    assert lp.token_logprobs == pytest.approx(want, abs=1e-5)
    c = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=3, temperature=0, logprobs=True,
                                       top_logprobs=2)
    content = c.choices[0].logprobs.content
    assert len(content) == 3 and all(len(t.top_logprobs) == 2 for t in content)
    assert content[0].logprob == pytest.approx(content[0].top_logprobs[0].logprob)  # greedy = the top token


def _stream_concurrently(server, requests: list[dict]) -> list[tuple[str, list[str], openai.types.CompletionUsage]]:
    """Stream every completion request at once; (text, tokens or [] without logprobs, usage) of each."""
    aclient = AsyncOpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=120)

    async def one(request: dict):
        stream = await aclient.completions.create(model="tiny", stream=True, stream_options={"include_usage": True},
                                                  **request)
        text, tokens, usage = "", [], None
        async for chunk in stream:
            for c in chunk.choices:
                text += c.text
                tokens += c.logprobs.tokens if c.logprobs else []
            usage = chunk.usage or usage
        return text, tokens, usage

    async def run_all():
        try:
            return await asyncio.gather(*(one(r) for r in requests))
        finally:
            await aclient.close()

    return asyncio.run(run_all())


def test_32_concurrent_streams_complete_with_correct_usage(server, llm):
    prompts = [f"Request number {i}: " + "word " * (i % 7) for i in range(32)]
    max_tokens = [2 + i % 5 for i in range(32)]
    results = _stream_concurrently(server, [
        dict(prompt=p, max_tokens=m, temperature=0.8, seed=i, extra_body={"ignore_eos": True})
        for i, (p, m) in enumerate(zip(prompts, max_tokens))])
    assert [usage.completion_tokens for _, _, usage in results] == max_tokens
    assert [usage.prompt_tokens for _, _, usage in results] == [len(llm.tokenizer.encode(p)) for p in prompts]
    assert all(text for text, _, _ in results)


def test_32_concurrent_greedy_streams_match_llm_generate(server, llm):
    """Batched with 31 others, a greedy request gets the tokens it gets alone (`LLM.generate`)."""
    prompts = [f"Greedy request {i}: " + "word " * (i % 5) for i in range(32)]
    max_tokens = [1 + i % 4 for i in range(32)]
    expected = llm.generate(prompts, [greedy(m) for m in max_tokens])
    results = _stream_concurrently(server, [dict(prompt=p, max_tokens=m, temperature=0, logprobs=0)
                                            for p, m in zip(prompts, max_tokens)])
    for want, (text, tokens, usage) in zip(expected, results):
        completion = want.outputs[0]
        assert text == completion.text
        assert tokens == [llm.tokenizer.decode([t], skip_special_tokens=False) for t in completion.token_ids]
        assert (usage.prompt_tokens, usage.completion_tokens) == (len(want.prompt_token_ids), len(completion.token_ids))


def _metrics_once_idle(server, seconds: float) -> dict:
    """/metrics as soon as no request runs and no KV page is used, or after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        m = server.metrics()
        idle = m["v4serve_kv_pages_used"] == 0 and m["v4serve_num_requests_running"] == 0
        if idle or time.monotonic() >= deadline:
            return m
        time.sleep(0.1)


def test_disconnect_mid_stream_frees_pages(server):
    body = {"model": "tiny", "prompt": "Tell me a very long story.", "max_tokens": 3000, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", server.url + "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            assert sum(1 for _, line in zip(range(6), lines) if line.startswith("data:")) >= 3
            during = server.metrics()
    assert during["v4serve_num_requests_running"] == 1 and during["v4serve_kv_pages_used"] > 0
    after = _metrics_once_idle(server, seconds=15)
    assert after["v4serve_kv_pages_used"] == 0 and after["v4serve_num_requests_running"] == 0
    assert after["v4serve_generation_tokens_total"] < during["v4serve_generation_tokens_total"] + 1000


def test_metrics_exposition(server, client):
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3)
    text = httpx.get(server.url + "/metrics").text
    for name in ("v4serve_num_requests_running", "v4serve_num_requests_waiting", "v4serve_kv_pages_used",
                 "v4serve_kv_pages_total", "v4serve_prompt_tokens_total", "v4serve_generation_tokens_total",
                 "v4serve_num_preemptions_total", "v4serve_kv_cache_bytes", "v4serve_kv_cache_used_bytes",
                 "v4serve_time_to_first_token_seconds_bucket", "v4serve_time_per_output_token_seconds_count"):
        assert f"\n{name}" in text, name
    m = server.metrics()
    assert m["v4serve_kv_pages_total"] > 0 and m["v4serve_generation_tokens_total"] >= 3
    assert m["v4serve_kv_cache_bytes"] > m["v4serve_kv_pages_total"]


def test_client_sees_openai_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=-3)
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=CHAT, max_tokens=3)
    assert e.value.param == "model" and e.value.code == "model_not_found"


def test_non_streamed_client_that_gives_up_frees_pages(server):
    body = {"model": "tiny", "prompt": "Another long story.", "max_tokens": 3000, "ignore_eos": True}
    before = server.metrics()["v4serve_generation_tokens_total"]
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/completions", json=body, timeout=httpx.Timeout(60, read=1.5))
    m = _metrics_once_idle(server, seconds=15)
    assert m["v4serve_kv_pages_used"] == 0 and m["v4serve_num_requests_running"] == 0
    assert 0 < m["v4serve_generation_tokens_total"] - before < 1000  # it ran, and stopped early


def test_disconnect_before_the_first_chunk_frees_pages(server):
    """The client leaves while its long prompt is still being prefilled: no token was streamed yet."""
    body = {"model": "tiny", "prompt": "story " * 1200, "max_tokens": 2000, "ignore_eos": True, "stream": True}
    before = server.metrics()["v4serve_generation_tokens_total"]
    with httpx.Client(timeout=60) as http:
        with http.stream("POST", server.url + "/v1/completions", json=body) as response:
            assert response.status_code == 200  # headers only; the stream is closed unread
    after = _metrics_once_idle(server, seconds=20)
    assert after["v4serve_kv_pages_used"] == 0 and after["v4serve_num_requests_running"] == 0
    assert after["v4serve_generation_tokens_total"] - before < 1000  # stopped early, not at max_tokens
