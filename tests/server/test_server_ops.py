"""Operating the real server (`v4serve serve --model tiny --device cpu`) with the `openai` client:
an API key (401 in OpenAI's shape without it; /health and /metrics open), CORS preflights, a
bounded waiting queue (429 with Retry-After) and a request timeout that aborts the request and
frees its KV pages. Two servers: `ops` (key by flag, one running slot, a queue of 2, CORS for one
origin) and `timed` (key from V4SERVE_API_KEY, --request-timeout)."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from server_harness import ServerProcess, launch, tiny_server_args

KEY, SECOND_KEY = "sk-ops-test-key", "sk-second-key"  # --api-key takes several (key rotation)
ENV_KEY = "sk-from-the-environment"
GOOD_ORIGIN, EVIL_ORIGIN = "https://good.example", "https://evil.example"
QUEUE = 2
# Long enough that a 2-token request on a loaded 2-core machine (the server may still be building its
# grammar vocabulary on another thread) finishes well inside it; seen: 1.5 s was not.
TIMEOUT_S = 3.0
LONG = {"ignore_eos": True}  # with a large max_tokens: runs for minutes on the CPU unless stopped


@pytest.fixture(scope="module")
def ops(tmp_path_factory) -> ServerProcess:
    s = launch(tiny_server_args("--max-num-seqs", "1", "--api-key", KEY, SECOND_KEY, "--max-queued-requests", str(QUEUE),
                                "--allowed-origins", json.dumps([GOOD_ORIGIN]), "--allow-credentials"),
               tmp_path_factory.mktemp("ops") / "server.log")
    yield s
    s.stop()


@pytest.fixture(scope="module")
def timed(tmp_path_factory) -> ServerProcess:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("V4SERVE_API_KEY", ENV_KEY)
        s = launch(tiny_server_args("--request-timeout", str(TIMEOUT_S)),
                   tmp_path_factory.mktemp("timed") / "server.log")
    yield s
    s.stop()


def _client(server: ServerProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=60)


def _check_error(body: dict, status_type: str, code: str) -> None:
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, body
    assert (error["type"], error["code"]) == (status_type, code), body
    assert error["message"], body


def _wait_metrics(server: ServerProcess, ok, timeout: float = 20) -> dict[str, float]:
    """Poll /metrics until `ok(samples)`; fail with the last samples."""
    deadline = time.monotonic() + timeout
    while True:
        m = server.metrics()
        if ok(m):
            return m
        if time.monotonic() > deadline:
            pytest.fail(f"metrics never reached the expected state: {m}")
        time.sleep(0.05)


def _idle(m: dict[str, float]) -> bool:
    return (m["v4serve_num_requests_running"], m["v4serve_num_requests_waiting"], m["v4serve_kv_pages_used"]) == (0, 0, 0)


# --------------------------------------------------------------------------------------- API key
def test_wrong_or_missing_key_is_a_401_and_the_right_key_works(ops):
    with pytest.raises(openai.AuthenticationError) as e:
        _client(ops, "sk-wrong").completions.create(model="tiny", prompt="hi", max_tokens=1)
    assert e.value.status_code == 401 and e.value.response.headers["www-authenticate"] == "Bearer"
    _check_error(e.value.response.json(), "invalid_request_error", "invalid_api_key")
    with pytest.raises(openai.AuthenticationError):
        _client(ops, KEY + "x").chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.AuthenticationError):
        _client(ops, KEY[:-1]).models.list()
    for headers in ({}, {"authorization": KEY}, {"authorization": f"Basic {KEY}"}, {"authorization": "Bearer"}):
        r = httpx.post(ops.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 1}, headers=headers)
        assert r.status_code == 401, (headers, r.text)
        _check_error(r.json(), "invalid_request_error", "invalid_api_key")
    assert httpx.get(ops.url + "/v1/nowhere").status_code == 401  # no route is revealed without the key

    good = _client(ops, KEY)
    assert [m.id for m in good.models.list().data] == ["tiny"]
    out = good.completions.create(model="tiny", prompt="hi", max_tokens=2, extra_body=LONG)
    assert out.usage.completion_tokens == 2
    assert [m.id for m in _client(ops, SECOND_KEY).models.list().data] == ["tiny"]
    r = httpx.get(ops.url + "/v1/models", headers={"authorization": f"bearer  {KEY}"})  # scheme in any case
    assert r.status_code == 200


def test_health_and_metrics_need_no_key(ops):
    assert httpx.get(ops.url + "/health").status_code == 200
    r = httpx.get(ops.url + "/metrics")
    assert r.status_code == 200 and "v4serve_kv_pages_total" in r.text


# ------------------------------------------------------------------------------------------ CORS
def test_cors_preflight(ops):
    preflight = {"access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type"}
    r = httpx.options(ops.url + "/v1/chat/completions", headers={"origin": GOOD_ORIGIN, **preflight})
    assert r.status_code == 200, r.text  # not 405, and no key needed
    assert r.headers["access-control-allow-origin"] == GOOD_ORIGIN
    assert r.headers["access-control-allow-credentials"] == "true"
    assert "POST" in r.headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= {h.strip().lower() for h in
                                                 r.headers["access-control-allow-headers"].split(",")}
    r = httpx.options(ops.url + "/v1/chat/completions", headers={"origin": EVIL_ORIGIN, **preflight})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers

    # Answers to an allowed origin carry the header, a 401 included (the browser can read it).
    r = httpx.get(ops.url + "/v1/models", headers={"origin": GOOD_ORIGIN})
    assert r.status_code == 401 and r.headers["access-control-allow-origin"] == GOOD_ORIGIN
    r = httpx.get(ops.url + "/v1/models", headers={"origin": GOOD_ORIGIN, "authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == GOOD_ORIGIN
    r = httpx.get(ops.url + "/v1/models", headers={"origin": EVIL_ORIGIN, "authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# ----------------------------------------------------------------------------------------- queue
def test_full_queue_is_a_429_with_retry_after(ops):
    client = _client(ops, KEY)
    _wait_metrics(ops, _idle)
    running = client.completions.create(model="tiny", prompt="hold the slot", max_tokens=3000, stream=True,
                                        extra_body=LONG)
    waiting = None
    try:
        next(iter(running))  # the one slot (--max-num-seqs 1) is taken
        waiting = client.completions.create(model="tiny", prompt="wait", max_tokens=3000, n=QUEUE, stream=True,
                                            extra_body=LONG)
        _wait_metrics(ops, lambda m: m["v4serve_num_requests_waiting"] == QUEUE)
        for attempt in (lambda: client.completions.create(model="tiny", prompt="one more", max_tokens=1),
                        lambda: client.chat.completions.create(model="tiny", max_tokens=1, stream=True,
                                                               messages=[{"role": "user", "content": "hi"}])):
            with pytest.raises(openai.RateLimitError) as e:
                attempt()
            assert e.value.status_code == 429 and e.value.response.headers["retry-after"] == "1"
            _check_error(e.value.response.json(), "rate_limit_error", "rate_limit_exceeded")
        assert ops.metrics()["v4serve_num_requests_waiting"] == QUEUE  # the refused requests queued nothing
    finally:
        running.close()
        if waiting is not None:
            waiting.close()
    _wait_metrics(ops, _idle)  # the clients left: their requests were aborted
    out = client.completions.create(model="tiny", prompt="again", max_tokens=2, n=QUEUE + 1, extra_body=LONG)
    assert [c.finish_reason for c in out.choices] == ["length"] * (QUEUE + 1)  # admitted whole below the bound


# --------------------------------------------------------------------------------------- timeout
def _in_use_while(server: ServerProcess, call) -> tuple[float, int, BaseException | None]:
    """Run `call` on a thread while watching /metrics: (its seconds, the most pages seen in use,
    what it raised)."""
    result: dict = {}

    def run() -> None:
        start = time.monotonic()
        try:
            call()
        except BaseException as e:  # noqa: BLE001 (handed to the test)
            result["error"] = e
        result["seconds"] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    most = 0
    while thread.is_alive():
        most = max(most, int(server.metrics()["v4serve_kv_pages_used"]))
        time.sleep(0.05)
    thread.join()
    return result["seconds"], most, result.get("error")


def test_timeout_aborts_and_frees_pages(timed):
    client = _client(timed, ENV_KEY)  # the key came from V4SERVE_API_KEY
    with pytest.raises(openai.AuthenticationError):
        _client(timed, KEY).models.list()
    assert client.completions.create(model="tiny", prompt="quick", max_tokens=2).usage.completion_tokens <= 2

    _wait_metrics(timed, _idle)
    before = timed.metrics()["v4serve_generation_tokens_total"]
    seconds, most, error = _in_use_while(timed, lambda: client.completions.create(
        model="tiny", prompt="too long", max_tokens=3000, extra_body=LONG))
    assert isinstance(error, openai.APIStatusError) and error.status_code == 408, error
    assert error.response.headers["x-should-retry"] == "false"  # the openai client would retry a 408
    _check_error(error.response.json(), "timeout_error", "request_timeout")
    assert TIMEOUT_S <= seconds < TIMEOUT_S + 10 and most > 0
    m = _wait_metrics(timed, _idle, timeout=5)  # aborted: nothing runs on, every page is free again
    assert 0 < m["v4serve_generation_tokens_total"] - before < 3000

    def stream() -> None:
        chunks = client.chat.completions.create(model="tiny", max_tokens=3000, stream=True, extra_body=LONG,
                                                messages=[{"role": "user", "content": "talk"}])
        for _ in chunks:
            pass

    seconds, most, error = _in_use_while(timed, stream)
    assert isinstance(error, openai.APIError) and "--request-timeout" in error.message, error
    assert TIMEOUT_S <= seconds < TIMEOUT_S + 10 and most > 0
    _wait_metrics(timed, _idle, timeout=5)

    # A client that stops reading is stopped at the deadline all the same; the error is its last event.
    body = {"prompt": "unread", "max_tokens": 3000, "stream": True, **LONG}
    with httpx.stream("POST", timed.url + "/v1/completions", json=body, timeout=60,
                      headers={"authorization": f"Bearer {ENV_KEY}"}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: {")
        _wait_metrics(timed, _idle, timeout=TIMEOUT_S + 5)  # while nothing is read
        events = [line for line in lines if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    _check_error(json.loads(events[-2][6:]), "timeout_error", "request_timeout")
