"""API-key authentication: an ASGI middleware in front of every route but `OPEN_PATHS`.

A request must carry `Authorization: Bearer <key>` (the scheme in any case) with one of the
server's keys (`--api-key K1 [K2 ...]`, as vLLM's, e.g. to rotate keys; else the
`V4SERVE_API_KEY` environment variable), or it gets a 401 in OpenAI's error shape with
`WWW-Authenticate: Bearer`. The token is compared as bytes with every key by
`hmac.compare_digest`, whose time does not depend on where two strings first differ, and
without stopping at a match, so the answer's timing does not leak a key a prefix at a time.
(vLLM checks only some path prefixes; here every route but the open ones needs a key.)

Open: `/health` and `/metrics` (probes and scrapers carry no key), and every OPTIONS request
(a CORS preflight carries no credentials; the CORS middleware outside this one answers it).
A pure ASGI middleware, so streams and disconnect detection pass through it untouched.
"""

from __future__ import annotations

import hmac

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from v4serve.server.errors import unauthorized

OPEN_PATHS = frozenset({"/health", "/metrics"})
API_KEY_ENV = "V4SERVE_API_KEY"


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The token of the first `Authorization: Bearer <token>` header, or None."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            if scheme.lower() != b"bearer":
                return None
            return token.strip()
    return None


class APIKeyMiddleware:
    def __init__(self, app: ASGIApp, api_keys: list[str]):
        if not api_keys or not all(api_keys):
            raise ValueError(f"api_keys: expected one or more non-empty keys, got {len(api_keys)} keys")
        self.app = app
        self._keys = [key.encode("utf-8") for key in api_keys]

    def authorized(self, scope: Scope) -> bool:
        token = bearer_token(scope.get("headers", []))
        if token is None:
            return False
        matches = [hmac.compare_digest(token, key) for key in self._keys]  # every key, always
        return any(matches)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in OPEN_PATHS
                or self.authorized(scope)):
            await self.app(scope, receive, send)
            return
        e = unauthorized()
        await JSONResponse(e.body(), status_code=e.status, headers=e.headers)(scope, receive, send)
