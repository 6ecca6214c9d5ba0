"""API-key authentication: an ASGI middleware in front of every route but `OPEN_PATHS`.

A request must carry `Authorization: Bearer <key>` (the scheme in any case) with the server's
key (`--api-key` or the `V4SERVE_API_KEY` environment variable), or it gets a 401 in OpenAI's
error shape with `WWW-Authenticate: Bearer`. The key is compared as bytes with
`hmac.compare_digest`, whose time does not depend on where the two first differ, so the
answer's timing does not leak the key a prefix at a time.

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
    def __init__(self, app: ASGIApp, api_key: str):
        if not api_key:
            raise ValueError("api_key: must not be empty")
        self.app = app
        self._key = api_key.encode("utf-8")

    def authorized(self, scope: Scope) -> bool:
        token = bearer_token(scope.get("headers", []))
        return token is not None and hmac.compare_digest(token, self._key)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] == "OPTIONS" or scope["path"] in OPEN_PATHS
                or self.authorized(scope)):
            await self.app(scope, receive, send)
            return
        e = unauthorized()
        await JSONResponse(e.body(), status_code=e.status, headers=e.headers)(scope, receive, send)
