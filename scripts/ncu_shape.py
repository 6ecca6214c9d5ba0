"""Run one `bench kernels` shape a few times, eagerly, for Nsight Compute (development tool).

    ncu --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
        -k regex:_v41_scores_stream_kernel --launch-skip 2 --launch-count 1 \
        python3 scripts/ncu_shape.py 'cand decode B4 ctx131072 NC16384'

The shape is built as `bench kernels` builds it (v4serve.bench.kernels.build) and called `--calls`
times (default 4) with a synchronize after each, so that --launch-skip can pass the compiles.
"""
import argparse

import torch

from v4serve.bench.kernels import build
from v4serve.bench.shapes import all_shapes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", help="a `bench kernels` shape name")
    parser.add_argument("--calls", type=int, default=4)
    args = parser.parse_args()
    fn = build(*all_shapes()[args.shape], "cuda")[0]
    for _ in range(args.calls):
        fn()
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
