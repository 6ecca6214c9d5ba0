"""The FastAPI app factory: routes, body limits, and errors in OpenAI's shape.

    POST /v1/completions        POST /v1/chat/completions
    GET  /v1/models             GET  /health             GET /metrics

Operating it (each off by default but CORS, which allows every origin, as vLLM's): an API key
checked in front of every route but /health and /metrics (auth.py), CORS around everything
(cors.py), a bounded waiting queue and a request timeout (`RequestLimits`, serving.py).

The app owns an `EngineLoop` over the engine it is given; the loop starts with the app and stops
after uvicorn has drained the requests in flight (SIGTERM).

The event loop only moves bytes: a body is read here, then parsed, validated and tokenized on
a worker thread (`prepare_*`; the tokenizer releases the GIL), so a large or slow request never
stalls `/health` or the streams of others. The raw body is not kept once it has been handed over,
and an error raised there drops the worker's frames (which hold the body's strings); after a large
body the freed heap goes back to the system (memory.py).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
import threading
from contextlib import asynccontextmanager
from typing import Any, Awaitable, Callable

from fastapi import FastAPI
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest

from v4serve.engine import Engine
from v4serve.server.auth import APIKeyMiddleware
from v4serve.server.chat import create_chat_completion, prepare_chat_completion
from v4serve.server.completions import create_completion, prepare_completion
from v4serve.server.context import ServingContext
from v4serve.server.cors import CORSConfig, add_cors
from v4serve.server.engine_loop import EngineLoop
from v4serve.server.errors import APIError, server_error
from v4serve.server.metrics import Metrics
from v4serve.server.limits import MAX_SEQS_PER_REQUEST, RequestLimits
from v4serve.server.memory import release_free_memory
from v4serve.server.prompt_length import PromptLimit
from v4serve.server.protocol import MAX_BODY_BYTES
from v4serve.server.responses import now
from v4serve.tokenizer import Tokenizer

log = logging.getLogger("v4serve.server")

NUM_WORKERS = 4  # threads that parse and tokenize request bodies
LARGE_BODY_BYTES = 2**20  # after a body this large, free heap memory goes back to the system
TRIM_DELAY_S = 0.2

Prepare = Callable[[ServingContext, bytes], Any]
Handler = Callable[[ServingContext, Any, HTTPRequest], Awaitable[Response]]


def create_app(engine: Engine, model_name: str, max_body_bytes: int = MAX_BODY_BYTES,
               max_seqs_per_request: int = MAX_SEQS_PER_REQUEST, limits: RequestLimits = RequestLimits(),
               api_keys: list[str] | None = None, cors: CORSConfig = CORSConfig()) -> FastAPI:
    """`api_keys` None: no key required."""
    metrics = Metrics(model_name)
    ctx = ServingContext(
        engine_loop=EngineLoop(engine, metrics),
        metrics=metrics,
        tokenizer=Tokenizer(engine.tokenizer.file),
        model_name=model_name,
        max_model_len=engine.max_model_len,
        vocab_size=engine.config.vocab_size,
        max_body_bytes=max_body_bytes,
        max_seqs_per_request=max_seqs_per_request,
        prompt_limit=PromptLimit.for_tokenizer(engine.tokenizer.file, engine.max_model_len),
        workers=ThreadPoolExecutor(NUM_WORKERS, thread_name_prefix="v4serve-prepare"),
        limits=limits,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        # The grammar compiler's vocabulary takes seconds to build: not on the engine thread.
        threading.Thread(target=engine.structured.prepare, name="v4serve-grammar", daemon=True).start()
        ctx.engine_loop.start()
        yield
        ctx.engine_loop.stop()
        ctx.workers.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="v4serve", lifespan=lifespan)
    _add_error_handlers(app)
    if api_keys is not None:
        app.add_middleware(APIKeyMiddleware, api_keys=api_keys)
    add_cors(app, cors)  # the outermost: preflights never reach the key check, and 401s carry CORS headers

    def endpoint(prepare: Prepare, handler: Handler):
        async def run(http: HTTPRequest) -> Response:
            prepared = await _off_loop(ctx, prepare, await _read_body(http, ctx.max_body_bytes))
            return await handler(ctx, prepared, http)

        return run

    app.post("/v1/completions")(endpoint(prepare_completion, create_completion))
    app.post("/v1/chat/completions")(endpoint(prepare_chat_completion, create_chat_completion))

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

    app.state.engine_loop = ctx.engine_loop
    return app


async def _off_loop(ctx: ServingContext, prepare: Prepare, raw: bytes) -> Any:
    """`prepare(ctx, raw)` on a worker thread. Deep recursion anywhere in it is a client's
    doing (a nested body): a 400, not a 500."""
    large = len(raw) >= LARGE_BODY_BYTES
    job = asyncio.get_running_loop().run_in_executor(ctx.workers, prepare, ctx, raw)
    del raw  # the worker holds the only reference, and drops it when done
    try:
        return await job
    except APIError as e:
        raise e.with_traceback(None) from None
    except RecursionError:
        raise APIError("body: nested too deeply", param="body") from None
    finally:
        if large:  # once this request's objects are gone (its answer sent), not now
            asyncio.get_running_loop().call_later(TRIM_DELAY_S, _trim, ctx.workers)


def _trim(workers: ThreadPoolExecutor) -> None:
    try:
        workers.submit(release_free_memory)
    except RuntimeError:  # the server is shutting down
        pass


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
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)
