"""Command line: `v4serve generate | serve | bench | kernels`."""

from __future__ import annotations

import argparse
import json
import sys


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="tiny", help="preset name (tiny, deepseek-v4-flash, deepseek-v4-pro) or checkpoint folder")
    p.add_argument("--device", choices=["cpu", "cuda"], default=None, help="default: cuda when present")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                   help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--hf-overrides", type=json.loads, default=None,
                   help='JSON object of config.json fields to override, e.g. \'{"num_hidden_layers": 8}\'')
    from v4serve.engine.offload import add_weight_args

    add_weight_args(p)


def _generate(args: argparse.Namespace) -> int:
    from v4serve import LLM, SamplingParams

    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.seed)
    llm = LLM(args.model, device=args.device, dtype=args.dtype, max_model_len=args.max_model_len,
              hf_overrides=args.hf_overrides, quantization=args.quantization, cpu_offload_gb=args.cpu_offload_gb)
    print("\n".join(llm.engine.banner()), file=sys.stderr)
    out = llm.generate([args.prompt], params)[0].outputs[0]
    print(out.text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="v4serve", description="DeepSeek-V4 inference engine")
    commands = parser.add_subparsers(dest="command", required=True)

    gen = commands.add_parser("generate", help="complete one prompt and print the continuation")
    _add_model_args(gen)
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=32)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=-1)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(run=_generate)

    serve = commands.add_parser("serve", add_help=False,
                                help="OpenAI-compatible HTTP server (`v4serve serve --help` for its options)")
    serve.set_defaults(run=lambda a: _delegate("v4serve.server.serve", []))

    bench = commands.add_parser(
        "bench", help="benchmarks: `bench kernels`, `bench engine` (TTFT/TPOT offline), `bench serve` (load on a server)"
    )
    bench.add_argument("what", choices=["kernels", "engine", "serve"])
    bench.add_argument("rest", nargs=argparse.REMAINDER)
    bench.set_defaults(run=lambda a: _delegate(f"v4serve.bench.{a.what}", a.rest))

    kernels = commands.add_parser("kernels", help="`kernels report`: compile-only codegen report of every Triton kernel")
    kernels.add_argument("what", choices=["report"])
    kernels.add_argument("rest", nargs=argparse.REMAINDER)
    kernels.set_defaults(run=lambda a: _delegate("v4serve.codegen", a.rest))

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:  # its options live with the server (imported only when serving)
        return _delegate("v4serve.server.serve", argv[1:])
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
