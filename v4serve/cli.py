"""Command line: `v4serve generate | serve | bench | kernels`."""

from __future__ import annotations

import argparse
import sys

from v4serve.engine_flags import add_engine_args, engine_kwargs

DEFAULTS = argparse.ArgumentDefaultsHelpFormatter


def _generate(args: argparse.Namespace) -> int:
    from v4serve import LLM, SamplingParams

    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens)
    llm = LLM(**engine_kwargs(args))
    print("\n".join(llm.engine.banner()), file=sys.stderr)
    out = llm.generate([args.prompt], params)[0].outputs[0]
    print(out.text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="v4serve", description="DeepSeek-V4 inference engine",
                                     formatter_class=DEFAULTS)
    commands = parser.add_subparsers(dest="command", required=True)

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # its options live with the server
        return _delegate("v4serve.server.serve", argv[1:])
    gen = commands.add_parser("generate", help="complete one prompt and print the continuation",
                              formatter_class=DEFAULTS)
    gen.add_argument("prompt", help="the text to continue (encoded as written, no chat template)")
    sampling = gen.add_argument_group("sampling")
    sampling.add_argument("--max-tokens", type=int, default=32, help="tokens to generate at most")
    sampling.add_argument("--temperature", type=float, default=0.0, help="0 is greedy")
    sampling.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass")
    sampling.add_argument("--top-k", type=int, default=-1, help="sample among the k most likely (-1: all)")
    add_engine_args(gen)
    gen.set_defaults(run=_generate)

    serve = commands.add_parser("serve", add_help=False,
                                help="OpenAI-compatible HTTP server (`v4serve serve --help` for its options)")
    serve.set_defaults(run=lambda a: _delegate("v4serve.server.serve", []))

    bench = commands.add_parser(
        "bench", formatter_class=DEFAULTS, help="benchmarks: `bench kernels`, `bench engine` (TTFT/TPOT offline), `bench serve` (load on a server)"
    )
    bench.add_argument("what", choices=["kernels", "engine", "serve"], help="which benchmark")
    bench.add_argument("rest", nargs=argparse.REMAINDER, help="its options (`v4serve bench WHAT --help`)")
    bench.set_defaults(run=lambda a: _delegate(f"v4serve.bench.{a.what}", a.rest))

    kernels = commands.add_parser("kernels", formatter_class=DEFAULTS,
                                  help="`kernels report`: compile-only codegen report of every Triton kernel")
    kernels.add_argument("what", choices=["report"], help="what to do")
    kernels.add_argument("rest", nargs=argparse.REMAINDER, help="its options (`v4serve kernels report --help`)")
    kernels.set_defaults(run=lambda a: _delegate("v4serve.codegen", a.rest))

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _delegate(module: str, argv: list[str]) -> int:
    import importlib

    return importlib.import_module(module).main(argv) or 0


if __name__ == "__main__":
    sys.exit(main())
