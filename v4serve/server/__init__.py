"""OpenAI-compatible HTTP server over the engine.

    app.py           the FastAPI app factory and its routes
    protocol.py      request bodies: parsing and validation into typed requests
    responses.py     engine outputs to OpenAI response and chunk objects
    engine_loop.py   the one thread that owns and steps the engine
    metrics.py       Prometheus counters, gauges and histograms
    sse.py           server-sent events framing
    errors.py        OpenAI-shaped errors
    serve.py         `v4serve serve`: build the engine, print the KV budget, run uvicorn
"""

from v4serve.server.app import create_app

__all__ = ["create_app"]
