#!/usr/bin/env bash
# One GPU session: full-shape kernel tests, the kernel benchmark and the tile sweep.
# Usage (repo root, on the GPU machine): OUT=/some/dir scripts/gpu_run.sh [--no-sweep]
set -uo pipefail
OUT=${OUT:-/tmp/v4serve-gpu}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
{
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  git rev-parse HEAD 2>/dev/null || true
  $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$OUT/env.txt"
$PY -m pytest -m gpu tests/ops -q -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 25
$PY -m v4serve.bench.kernels --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log" | grep -v '^{'
if [[ "${1:-}" != "--no-sweep" ]]; then
  $PY -m v4serve.bench.kernel_configs 2>&1 | tee "$OUT/sweep.log" | tail -n 60
fi
