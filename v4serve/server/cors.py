"""CORS, with vLLM's flags: `--allowed-origins`, `--allowed-methods`, `--allowed-headers` (each a
JSON list of strings, `["*"]` by default, as vLLM's) and `--allow-credentials`.

Starlette's CORSMiddleware wraps the whole app (outside the API-key check): a preflight
(`OPTIONS` with `Origin` and `Access-Control-Request-Method`) is answered 200 with the
`Access-Control-Allow-*` headers, or 400 for an origin, method or header not allowed; every
other answer, a 401 included, carries `Access-Control-Allow-Origin` for an allowed origin, so
a browser client can read it. With credentials allowed and origins `["*"]`, the request's own
origin is echoed (a browser refuses `*` with credentials).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CORSConfig:
    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


def json_string_list(flag: str):
    """An argparse `type` for a flag whose value is a JSON list of strings; errors name the flag."""

    def parse(text: str) -> list[str]:
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            raise argparse.ArgumentTypeError(f"{flag}: expected a JSON list of strings, e.g. "
                                             f"'[\"https://example.com\"]', got {text!r}") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError(f"{flag}: expected a JSON list of strings, got {text!r}")
        return value

    return parse


def add_cors_args(p: argparse.ArgumentParser) -> None:
    defaults = CORSConfig()
    p.add_argument("--allowed-origins", type=json_string_list("--allowed-origins"), default=defaults.allowed_origins,
                   help='origins allowed to call the API from a browser (CORS), a JSON list, e.g. \'["https://a.example"]\'')
    p.add_argument("--allowed-methods", type=json_string_list("--allowed-methods"), default=defaults.allowed_methods,
                   help="HTTP methods allowed from those origins, a JSON list")
    p.add_argument("--allowed-headers", type=json_string_list("--allowed-headers"), default=defaults.allowed_headers,
                   help="request headers allowed from those origins, a JSON list")
    p.add_argument("--allow-credentials", action="store_true",
                   help="allow credentials (cookies, Authorization) on cross-origin requests")


def cors_config(args: argparse.Namespace) -> CORSConfig:
    return CORSConfig(args.allowed_origins, args.allowed_methods, args.allowed_headers, args.allow_credentials)


def add_cors(app, config: CORSConfig) -> None:
    """Wrap `app` (a FastAPI app) in CORSMiddleware; call after every other middleware."""
    from starlette.middleware.cors import CORSMiddleware

    app.add_middleware(CORSMiddleware, allow_origins=config.allowed_origins, allow_methods=config.allowed_methods,
                       allow_headers=config.allowed_headers, allow_credentials=config.allow_credentials)
