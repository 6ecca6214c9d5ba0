"""`v4serve serve` command-line flags reach the engine's arguments."""

from __future__ import annotations

import argparse

from v4serve.server.serve import add_serve_args, engine_args


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_args(parser)
    return parser.parse_args(list(argv))


def test_serve_flags_map_to_engine_args():
    args = engine_args(_parse("--max-num-seqs", "64", "--cuda-graph-sizes", "1", "8", "64", "--kv-cache-memory", "2GiB"))
    assert args.max_num_seqs == 64 and args.cuda_graph_sizes == (1, 8, 64) and args.kv_cache_memory == 2 * 2**30
    defaults = engine_args(_parse())
    assert defaults.cuda_graph_sizes is None and defaults.model == "tiny"


def test_server_flags_and_their_defaults():
    args = _parse()
    assert (args.max_seqs_per_request, args.max_body_bytes, args.host, args.port) == (256, 8 * 2**20, "127.0.0.1", 8000)
    assert _parse("--max-seqs-per-request", "1000", "--max-body-bytes", "1MiB").max_seqs_per_request == 1000
