"""The FastAPI app factory: routes, body limits, and errors in OpenAI's shape.

    POST /v1/completions        POST /v1/chat/completions
    GET  /v1/models             GET  /health             GET /metrics

The app owns an `EngineLoop` over the engine it is given; the loop starts with the app and stops
after uvicorn has drained the requests in flight (SIGTERM).
"""

from __future__ import annotations

import logging
import threading
from contextlib import asynccontextmanager
from typing import Awaitable, Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest

from v4serve.engine import Engine
from v4serve.server.chat import create_chat_completion
from v4serve.server.completions import create_completion
from v4serve.server.context import ServingContext
from v4serve.server.engine_loop import EngineLoop
from v4serve.server.errors import APIError, server_error
from v4serve.server.metrics import Metrics
from v4serve.server.protocol import MAX_BODY_BYTES, parse_body
from v4serve.server.responses import now
from v4serve.tokenizer import Tokenizer

log = logging.getLogger("v4serve.server")

Handler = Callable[[ServingContext, dict, HTTPRequest], Awaitable[Response]]


def create_app(engine: Engine, model_name: str, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    metrics = Metrics(model_name)
    ctx = ServingContext(
        engine_loop=EngineLoop(engine, metrics),
        metrics=metrics,
        tokenizer=Tokenizer(engine.tokenizer.file),
        model_name=model_name,
        max_model_len=engine.max_model_len,
        vocab_size=engine.config.vocab_size,
        max_body_bytes=max_body_bytes,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        # The grammar compiler's vocabulary takes seconds to build: not on the engine thread.
        threading.Thread(target=engine.structured.prepare, name="v4serve-grammar", daemon=True).start()
        ctx.engine_loop.start()
        yield
        ctx.engine_loop.stop()

    app = FastAPI(title="v4serve", lifespan=lifespan)
    _add_error_handlers(app)

    def endpoint(handler: Handler):
        async def run(http: HTTPRequest) -> Response:
            body = parse_body(await _read_body(http, ctx.max_body_bytes))
            return await handler(ctx, body, http)

        return run

    app.post("/v1/completions")(endpoint(create_completion))
    app.post("/v1/chat/completions")(endpoint(create_chat_completion))

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": model_name, "object": "model", "created": now(), "owned_by": "v4serve",
                "max_model_len": ctx.max_model_len}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        alive = ctx.engine_loop.snapshot.alive
        return JSONResponse({"status": "ok" if alive else "engine stopped"}, status_code=200 if alive else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return PlainTextResponse(metrics.render(ctx.engine_loop.snapshot),
                                 media_type="text/plain; version=0.0.4")

    return app


async def _read_body(http: HTTPRequest, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to exceed `limit` bytes."""
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks, size = [], 0
    async for chunk in http.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> APIError:
    return APIError(f"body: larger than the limit of {limit} bytes", param="body", status=413,
                    code="request_too_large")


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: HTTPRequest, e: APIError) -> Response:
        return _error_response(e)

    @app.exception_handler(HTTPException)
    async def http_error(_: HTTPRequest, e: HTTPException) -> Response:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return _error_response(APIError(str(e.detail), status=e.status_code, type=kind))

    @app.exception_handler(Exception)
    async def unexpected(_: HTTPRequest, e: Exception) -> Response:
        log.exception("unhandled error")
        return _error_response(server_error(f"internal error: {type(e).__name__}"))


def _error_response(e: APIError) -> Response:
    return JSONResponse(e.body(), status_code=e.status)
