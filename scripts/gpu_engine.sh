#!/usr/bin/env bash
# GPU session for the engine: the CUDA-graph runner test, then the engine benchmark (TTFT, TPOT at
# concurrency 1/8/64, GPU idle per decode step) on the Flash attention dimensions with 8 layers.
# Usage (repo root, GPU machine): OUT=/some/dir scripts/gpu_engine.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, PYTHONPATH (with .gpu_deps), PY, gpu_env_line
gpu_env_line | tee "$OUT/engine_env.txt"
timeout ${TEST_LIMIT:-150} $PY -m pytest -m gpu tests/engine/test_gpu_decode.py tests/ops/test_grouped_matmul.py -q -p no:cacheprovider 2>&1 \
  | tee "$OUT/pytest_engine.log" | tail -n 25
timeout ${BENCH_LIMIT:-400} $PY -m v4serve.bench.engine ${ENGINE_ARGS:-} 2>&1 | tee "$OUT/bench_engine.log" | tail -n 40
