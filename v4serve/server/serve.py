"""`v4serve serve`: build the engine, print the KV budget, serve the app with uvicorn.

SIGTERM (or Ctrl-C) stops accepting connections, lets every request in flight finish, then stops
the engine thread and exits (uvicorn's graceful shutdown, then the app's lifespan end).
"""

from __future__ import annotations

import argparse
import copy
import json
from typing import Callable

from v4serve.cache.budget import parse_size
from v4serve.engine import Engine, EngineArgs
from v4serve.engine.offload import add_weight_args
from v4serve.server.protocol import MAX_BODY_BYTES


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="preset name (tiny, deepseek-v4-flash, ...) or checkpoint folder")
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: --model)")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when present")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=EngineArgs.max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=EngineArgs.max_num_batched_tokens)
    p.add_argument("--kv-cache-memory", type=parse_size, default=None,
                   help="bytes for the KV cache, e.g. 2GiB (default: free GPU memory on cuda, full length on cpu)")
    p.add_argument("--cuda-graph-sizes", type=int, nargs="+", default=None, metavar="N",
                   help="decode batch sizes captured as CUDA graphs (default: 1 2 4 ... max-num-seqs)")
    p.add_argument("--hf-overrides", type=json.loads, default=None, help="JSON object of config.json overrides")
    add_weight_args(p)
    p.add_argument("--max-body-bytes", type=parse_size, default=MAX_BODY_BYTES)
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])


def engine_args(args: argparse.Namespace) -> EngineArgs:
    return EngineArgs(
        model=args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory=args.kv_cache_memory, hf_overrides=args.hf_overrides, progress=False,
        cuda_graph_sizes=None if args.cuda_graph_sizes is None else tuple(args.cuda_graph_sizes),
        quantization=args.quantization, cpu_offload_gb=args.cpu_offload_gb,
    )


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
    app = create_app(engine, name, max_body_bytes=args.max_body_bytes)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            log_config=_log_config(args.log_level), timeout_graceful_shutdown=None,
                            access_log=args.log_level == "debug")
    uvicorn.Server(config).run()
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
    parser = argparse.ArgumentParser(prog="v4serve serve", description="OpenAI-compatible HTTP server")
    add_serve_args(parser)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
