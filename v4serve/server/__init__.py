"""OpenAI-compatible HTTP server over the engine.

    app.py           the FastAPI app factory and its routes
    protocol.py      request bodies: parsing and validation into typed requests
    responses.py     engine outputs to OpenAI response and chunk objects
    engine_loop.py   the one thread that owns and steps the engine
    metrics.py       Prometheus counters, gauges and histograms
    sse.py           server-sent events framing
    errors.py        OpenAI-shaped errors
    serve.py         `v4serve serve`: build the engine, print the KV budget, run uvicorn
    json_body.py     JSON bodies: nesting limit, lone surrogates refused in every string
    tool_schemas.py  `tools`: names unique, `parameters` a JSON Schema object
    prompt_length.py refusing an over-long prompt from its length before tokenizing it
    limits.py        per-request limits (sequences per request)
    memory.py        returning freed heap to the system after a large body
"""

__all__ = ["create_app"]


def __getattr__(name: str):
    """`create_app` imported on first use: the rest of the package (and `serve --help`, and
    the message naming missing packages) must not need fastapi."""
    if name == "create_app":
        from v4serve.server.app import create_app

        return create_app
    raise AttributeError(name)
