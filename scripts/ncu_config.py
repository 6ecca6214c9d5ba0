"""Run one `kernel_configs` sparse-decode shape at a given tile config a few times, eagerly, for Nsight
Compute (development tool; scripts/ncu_shape.py runs production launches).

    ncu -k regex:_values_kernel --launch-skip 2 --launch-count 1 \
        python3 scripts/ncu_config.py 'decode fp8kv r4 B8' '{"PREFETCH": true}'

The JSON's keys update the shape's production decode config (fp8kv shapes: over packed rows).
"""
import argparse
import json

import torch

from v4serve.bench.kernel_configs import DECODE_SHAPES, PACKED_DECODE_SHAPES, _packed_run
from v4serve.bench.shapes import sparse_decode_case
from v4serve.ops.sparse_attn_triton import decode_config, sparse_attn_paged_triton


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", help="a kernel_configs decode shape, e.g. 'decode fp8kv r4 B8'")
    parser.add_argument("config", nargs="?", default="{}", help="JSON: keys over production's decode config")
    parser.add_argument("--calls", type=int, default=4)
    args = parser.parse_args()
    packed = args.shape in PACKED_DECODE_SHAPES
    ratio, B, pos = (PACKED_DECODE_SHAPES if packed else DECODE_SHAPES)[args.shape]
    case = sparse_decode_case(ratio, B, pos, "cuda")
    cfg = dict(decode_config(B, case.idx.shape[-1], packed, case.q.device), **json.loads(args.config))
    run = _packed_run(case) if packed else (lambda c: sparse_attn_paged_triton(*case.args(), tile_config=c))
    for _ in range(args.calls):
        run(dict(cfg))
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
