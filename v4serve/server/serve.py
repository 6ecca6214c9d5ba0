"""`v4serve serve`: build the engine, print the KV budget, serve the app with uvicorn.

Operating flags: `--api-key` (else the V4SERVE_API_KEY environment variable; the key itself is
never printed), vLLM's CORS flags (cors.py), `--max-queued-requests` and `--request-timeout`
(limits.py). They are the server's own: EngineArgs does not see them.

SIGTERM (or Ctrl-C) stops accepting connections, lets every request in flight finish, then stops
the engine thread and exits (uvicorn's graceful shutdown, then the app's lifespan end).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import os
import sys
from typing import Callable

from v4serve.cache.budget import parse_size
from v4serve.engine import Engine, EngineArgs
from v4serve.engine_flags import DEFAULT_MODEL, add_engine_args, engine_kwargs
from v4serve.server.auth import API_KEY_ENV
from v4serve.server.cors import add_cors_args, cors_config
from v4serve.server.limits import MAX_SEQS_PER_REQUEST, RequestLimits
from v4serve.server.protocol import MAX_BODY_BYTES

# The event loop, the engine thread and the body workers share the GIL: a thread that wants it
# waits up to this long for the holder to let go (CPython: 5 ms). Shorter keeps /health and the
# streams responsive while a worker parses a large body.
SWITCH_INTERVAL_S = 0.001


def add_serve_args(p: argparse.ArgumentParser) -> None:
    """The server's own flags, then every engine flag (derived from EngineArgs, as `generate`'s)."""
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL",
                   help="the model as vLLM's `vllm serve MODEL` takes it (a preset or checkpoint folder; the same "
                        "as --model, given first)")
    p.add_argument("--served-model-name", default=None, help="the name clients use (None: --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--max-body-bytes", type=parse_size, default=MAX_BODY_BYTES,
                   help="largest request body accepted (413 beyond), e.g. 8MiB")
    p.add_argument("--max-seqs-per-request", type=int, default=MAX_SEQS_PER_REQUEST,
                   help="most sequences (prompts x n) one request may ask for (400 beyond)")
    p.add_argument("--api-key", nargs="+", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer <key>' with one of these keys on every route but /health "
                        f"and /metrics (401 without it); unset: the {API_KEY_ENV} environment variable, if set")
    add_cors_args(p)
    p.add_argument("--max-queued-requests", type=int, default=None,
                   help="answer 429 (with Retry-After) while this many engine requests (prompts x n) wait "
                        "for a slot or pages; None: unbounded")
    p.add_argument("--request-timeout", type=float, default=None,
                   help="abort a request unfinished this many seconds after submission (408, its KV pages "
                        "freed); None: no limit")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                   help="uvicorn's and v4serve's log level")
    add_engine_args(p)


def engine_args(args: argparse.Namespace) -> EngineArgs:
    return EngineArgs(**engine_kwargs(args), progress=False)


def request_limits(args: argparse.Namespace) -> RequestLimits:
    return RequestLimits(args.max_queued_requests, args.request_timeout)


def api_keys(args: argparse.Namespace, environ=os.environ) -> list[str] | None:
    """--api-key's keys, else the environment variable's one; None (no key required) if neither
    is set (an empty variable is unset)."""
    if args.api_key:
        return list(args.api_key)
    key = environ.get(API_KEY_ENV)
    return [key] if key else None


def check_serve_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.model_tag is not None:  # `v4serve serve MODEL`, vLLM's spelling
        if args.model not in (DEFAULT_MODEL, args.model_tag):
            parser.error(f"the model is given twice: {args.model_tag!r} and --model {args.model!r}")
        args.model = args.model_tag
    if args.max_seqs_per_request < 1:
        parser.error(f"--max-seqs-per-request must be >= 1, got {args.max_seqs_per_request}")
    if args.max_queued_requests is not None and args.max_queued_requests < 1:
        parser.error(f"--max-queued-requests must be >= 1, got {args.max_queued_requests}")
    if args.request_timeout is not None and not args.request_timeout > 0:
        parser.error(f"--request-timeout must be > 0 seconds, got {args.request_timeout}")
    if args.api_key is not None and not all(key.strip() for key in args.api_key):
        parser.error("--api-key: a key must not be empty")


def missing_packages() -> list[str]:
    """The server's packages that are not installed (both are in the default install)."""
    return [name for name in ("fastapi", "uvicorn") if importlib.util.find_spec(name) is None]


def serve(args: argparse.Namespace, make_engine: Callable[[EngineArgs], Engine] = Engine) -> int:
    """Run the server until SIGTERM/SIGINT. `make_engine` lets a test entry point substitute a
    scripted model; production passes nothing."""
    import uvicorn

    from v4serve.server.app import create_app

    engine = make_engine(engine_args(args))
    name = args.served_model_name or args.model
    print(f"v4serve: serving {name!r} on {engine.device} (max_model_len {engine.max_model_len}, "
          f"max_num_seqs {engine.scheduler.max_num_seqs})")
    print("\n".join(engine.banner()), flush=True)
    keys = api_keys(args)
    limits = request_limits(args)
    print(f"v4serve: API key {'required' if keys else 'not required'}; waiting queue "
          f"{limits.max_queued_requests or 'unbounded'}; request timeout "
          f"{f'{limits.request_timeout_s:g} s' if limits.request_timeout_s else 'none'}", flush=True)
    app = create_app(engine, name, max_body_bytes=args.max_body_bytes,
                     max_seqs_per_request=args.max_seqs_per_request, limits=limits, api_keys=keys,
                     cors=cors_config(args))
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            log_config=_log_config(args.log_level), timeout_graceful_shutdown=None,
                            access_log=args.log_level == "debug")
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = uvicorn.Server(config)
    fatal: list[BaseException] = []

    def stop(error: BaseException) -> None:  # a tensor-parallel rank died (RankDied)
        fatal.append(error)
        server.should_exit = True

    app.state.engine_loop.on_fatal = stop
    server.run()
    if fatal:
        print(f"v4serve: stopped: {fatal[0]}", file=sys.stderr)
        return 1
    return 0


def _log_config(level: str) -> dict:
    """uvicorn's logging, extended to the `v4serve` loggers: without a handler their lines (a
    tool-call block returned as content, a failed engine step) would print bare, with no level,
    and ignore --log-level."""
    import uvicorn.config

    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    config["loggers"]["v4serve"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="v4serve serve", description="OpenAI-compatible HTTP server",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_serve_args(parser)
    args = parser.parse_args(argv)
    missing = missing_packages()
    if missing:
        print(f"error: `v4serve serve` needs {' and '.join(missing)}, not installed here; install them with: "
              f"pip install 'fastapi>=0.110' 'uvicorn>=0.29'", file=sys.stderr)
        return 2
    check_serve_args(parser, args)
    return serve(args)


if __name__ == "__main__":
    raise SystemExit(main())
