"""The operating flags of `v4serve serve` without a server: parsing, checks, the key's source and
its header, and how the app factory installs them."""

from __future__ import annotations

import argparse

import pytest

from v4serve.server.auth import APIKeyMiddleware, bearer_token
from v4serve.server.cors import CORSConfig
from v4serve.server.limits import RequestLimits
from v4serve.server.serve import add_serve_args, api_keys, check_serve_args, cors_config, request_limits


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    return parser


def _parse(*argv: str) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(list(argv))
    check_serve_args(parser, args)
    return args


def test_defaults_are_vllms_and_open():
    args = _parse()
    assert request_limits(args) == RequestLimits(None, None)  # unbounded queue, no timeout
    assert cors_config(args) == CORSConfig(["*"], ["*"], ["*"], False)
    assert api_keys(args, environ={}) is None


def test_flags_parse():
    args = _parse("--max-queued-requests", "64", "--request-timeout", "2.5", "--allowed-origins",
                  '["https://a.example", "https://b.example"]', "--allowed-methods", '["GET", "POST"]',
                  "--allowed-headers", '["authorization"]', "--allow-credentials")
    assert request_limits(args) == RequestLimits(64, 2.5)
    assert cors_config(args) == CORSConfig(["https://a.example", "https://b.example"], ["GET", "POST"],
                                           ["authorization"], True)


def test_the_model_as_vllm_serve_takes_it():
    """`v4serve serve MODEL ...` (vLLM's positional) is --model; given both ways it must agree."""
    from v4serve.server.serve import engine_args

    assert engine_args(_parse("/ckpt/DeepSeek-V4-Flash", "--max-num-seqs", "4")).model == "/ckpt/DeepSeek-V4-Flash"
    assert engine_args(_parse("tiny", "--model", "tiny")).model == "tiny"
    assert engine_args(_parse("--model", "deepseek-v4-flash")).model == "deepseek-v4-flash"
    assert engine_args(_parse()).model == "tiny"
    with pytest.raises(SystemExit):
        _parse("/ckpt/a", "--model", "/ckpt/b")


def test_api_key_flag_wins_over_the_environment():
    env = {"V4SERVE_API_KEY": "from-env"}
    assert api_keys(_parse("--api-key", "from-flag"), environ=env) == ["from-flag"]
    assert api_keys(_parse("--api-key", "old", "new"), environ=env) == ["old", "new"]
    assert api_keys(_parse(), environ=env) == ["from-env"]
    assert api_keys(_parse(), environ={"V4SERVE_API_KEY": ""}) is None


@pytest.mark.parametrize("argv, flag", [
    (["--max-queued-requests", "0"], "--max-queued-requests"),
    (["--request-timeout", "0"], "--request-timeout"),
    (["--request-timeout", "nan"], "--request-timeout"),
    (["--api-key", " "], "--api-key"),
    (["--api-key", "k1", ""], "--api-key"),
    (["--allowed-origins", "https://a.example"], "--allowed-origins"),
    (["--allowed-headers", '{"a": 1}'], "--allowed-headers"),
    (["--allowed-methods", '["GET", 1]'], "--allowed-methods"),
])
def test_bad_flags_are_named(argv, flag, capsys):
    with pytest.raises(SystemExit):
        _parse(*argv)
    assert flag in capsys.readouterr().err


def test_bearer_token():
    assert bearer_token([(b"authorization", b"Bearer k1")]) == b"k1"
    assert bearer_token([(b"Authorization", b"bearer   k1 ")]) == b"k1"
    assert bearer_token([(b"authorization", b"Basic k1")]) is None
    assert bearer_token([(b"authorization", b"k1")]) is None
    assert bearer_token([(b"content-type", b"application/json")]) is None
    for keys in ([], [""], ["k1", ""]):
        with pytest.raises(ValueError, match="api_keys"):
            APIKeyMiddleware(None, keys)


def test_every_key_is_accepted_and_only_those():
    middleware = APIKeyMiddleware(None, ["old-key", "new-key"])

    def scope(value: bytes) -> dict:
        return {"headers": [(b"authorization", value)]}

    assert middleware.authorized(scope(b"Bearer old-key")) and middleware.authorized(scope(b"Bearer new-key"))
    for bad in (b"Bearer old-ke", b"Bearer new-key2", b"Bearer ", b"Bearer old-key new-key", b"old-key"):
        assert not middleware.authorized(scope(bad)), bad
    assert not middleware.authorized({"headers": []})
