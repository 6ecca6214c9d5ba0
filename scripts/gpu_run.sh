#!/usr/bin/env bash
# One GPU session: the model's GPU path test (Triton vs torch ops), full-shape kernel tests, the
# kernel benchmark and the tile sweep, each under its own time limit, logs under $OUT.
# Usage (repo root, on the GPU machine): OUT=/some/dir scripts/gpu_run.sh [STAGE ...]
#   STAGE: model | ops | tests | bench | sweep[=FILTER] (default: model ops bench sweep, in that order)
#   tests: every @pytest.mark.gpu test of the suite (ops, model, engine, server)
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, PYTHONPATH (with .gpu_deps), PY, gpu_env_line
STAGES=("$@")
[[ ${#STAGES[@]} -eq 0 ]] && STAGES=(model ops bench sweep)
gpu_env_line | tee "$OUT/env.txt"
for stage in "${STAGES[@]}"; do
  t0=$SECONDS
  case "$stage" in
    model)
      timeout ${MODEL_LIMIT:-300} $PY -m pytest -m gpu tests/model/test_gpu_paths.py -q -s -p no:cacheprovider 2>&1 \
        | tee "$OUT/pytest_model.log" | grep -E 'gpu-paths|passed|failed|Error|error' | tail -n 30 ;;
    ops)
      timeout ${OPS_LIMIT:-200} $PY -m pytest -m gpu tests/ops -q -p no:cacheprovider 2>&1 \
        | tee "$OUT/pytest_gpu.log" | tail -n 15 ;;
    tests)
      # only the files that hold GPU tests: the server tests import client packages the image lacks
      timeout ${TESTS_LIMIT:-500} $PY -m pytest -m gpu $(grep -rl 'mark.gpu' tests --include='test_*.py' | sort) \
        -q -p no:cacheprovider 2>&1 \
        | tee "$OUT/pytest_all_gpu.log" | tail -n 25 ;;
    bench)
      timeout ${BENCH_LIMIT:-240} $PY -m v4serve.bench.kernels --json "$OUT/bench.json" ${BENCH_ARGS:-} 2>&1 \
        | tee "$OUT/bench.log" | grep -v -E '^\{|^# built' ;;
    sweep*)
      filter=${stage#sweep}; filter=${filter#=}
      timeout ${SWEEP_LIMIT:-240} $PY -m v4serve.bench.kernel_configs "$filter" 2>&1 \
        | tee "$OUT/sweep.log" | grep -v Warning | awk '{c[$1" "$2" "$3]++} c[$1" "$2" "$3] <= 4' ;;
    *) echo "unknown stage $stage" ;;
  esac
  echo "== stage $stage: $((SECONDS - t0)) s"
done
