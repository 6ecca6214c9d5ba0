#!/usr/bin/env bash
# What is merged but not yet run on a GPU (sessions 13-14: NOTES.md "Next session, first"), in
# stages that each fit one device call (<= 10 min), logs under $OUT, a summary table last.
# Usage (repo root, GPU machine): OUT=/some/dir scripts/gpu_pending.sh STAGE...
#   tests13 tests14a tests14b
#           the GPU tests of every unmeasured change, one pytest per group under its own limit
#           (GROUP_LIMIT, 180 s: a cold-compile group under one limit printed nothing in session 13)
#   rows    `bench kernels` rows of the changed kernels (sets the rules' thresholds), ~3 min
#   sweeps-a sweeps-b
#           the kernel_configs sweeps whose winners are one-line production switches, ~6-7 min each
#   flash   the 43-layer V4-Flash end to end (Zipf, placement by use, offload auto), c1 / c8, ~2.5 min
#   spec    speculative verify on 30 layers, c1 / c8, k = 3, ~3 min
# Files under $OUT: pending_<stage>.log (+ .json where the tool writes one); at most 8 come back.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, PYTHONPATH (with .gpu_deps), PY, gpu_env_line
(($#)) || { echo "usage: $0 tests13|tests14a|tests14b|rows|sweeps-a|sweeps-b|flash|spec ..." >&2; exit 2; }
summary=()

run() {  # run LIMIT LOG COMMAND...: the command under its time limit, appended to LOG
  local limit=$1 log=$2
  shift 2
  echo "\$ $*" >> "$log"
  timeout -s INT "$limit" "$@" >> "$log" 2>&1
  local rc=$?
  summary+=("$(printf '%-10s rc=%-3s %s' "$(basename "$log" .log)" "$rc" "$(tail -n 1 "$log" | cut -c1-110)")")
}

pytest_group() {  # pytest_group LOG FILE_OR_NODE...
  local log=$1
  shift
  run "${GROUP_LIMIT:-180}" "$log" $PY -m pytest -m gpu -q -p no:cacheprovider "$@"
}

for stage in "$@"; do
  t0=$SECONDS
  log="$OUT/pending_${stage}.log"
  gpu_env_line > "$log"
  case "$stage" in
    tests13)  # session 13's late merges: o_a_proj in FP8, the launch-glue fusions
      pytest_group "$log" tests/ops/test_fp8_grouped_linear.py tests/model/test_o_a_fp8_gpu.py tests/ops/test_pick_columns.py
      pytest_group "$log" tests/ops/test_norm_rope.py tests/ops/test_indexer_kernel_gpu.py -k "also_norm or weight_scale"
      pytest_group "$log" tests/model/test_gpu_paths.py
      ;;
    tests14a)  # session 14: FP8 at 17..32 rows, sort-free MoE decode, packed B8 variants
      pytest_group "$log" tests/ops/test_fp8_linear_rows32.py tests/ops/test_fp8_linear_w8a16_decode.py
      pytest_group "$log" tests/ops/test_mxfp4_moe_decode.py tests/ops/test_mxfp4_gemv.py tests/model/test_quantized_gpu.py
      pytest_group "$log" tests/ops/test_packed_kernels_gpu.py -k variants
      ;;
    tests14b)  # session 14: index top-k, shared-expert SwiGLU in the FP8 epilogue, MoE GEMV on tensor cores
      pytest_group "$log" tests/ops/test_index_topk.py
      pytest_group "$log" tests/ops/test_fp8_linear_swiglu.py tests/model/test_shared_expert_swiglu.py
      pytest_group "$log" tests/ops/test_mxfp4_moe_mma.py
      ;;
    rows)
      run 300 "$log" $PY -m v4serve.bench.kernels --no-cold --json "$OUT/pending_rows.json" \
        --only 'o_a |glue |indexer scores decode|mxfp4 moe flash|sparse decode|fp8 linear'
      ;;
    sweeps-a)  # FP8 at 17..32 rows, MoE decode c1 / c8 and verify, shared SwiGLU
      run 150 "$log" $PY -m v4serve.bench.kernel_configs 'fp8 decode rows'
      run 120 "$log" $PY -m v4serve.bench.kernel_configs 'moe flash c'
      run 90 "$log" $PY -m v4serve.bench.kernel_configs 'moe flash verify'
      run 90 "$log" $PY -m v4serve.bench.kernel_configs 'fp8 decode swiglu'
      ;;
    sweeps-b)  # packed B8 variants, index top-k, V4.1 indexer's one-wave trigger rule
      for r in 4 128 0; do run 60 "$log" $PY -m v4serve.bench.kernel_configs "fp8kv r$r B8"; done
      run 120 "$log" $PY -m v4serve.bench.kernel_configs 'index topk'
      run 90 "$log" $PY -m v4serve.bench.v41_index_configs 'cand decode|staged1M|start130944'
      ;;
    flash)
      run 420 "$log" $PY -m v4serve.bench.engine --model deepseek-v4-flash --hf-overrides '{}' --cpu-offload-gb auto \
        --routing zipf --placement by-use --concurrency 1 8 --cuda-graph-sizes 1 8 --output-len 96 \
        --max-model-len 8448 --num-kv-pages 2200 --ttft-prompt-lens 2048 --ttft-repeats 1 \
        --calibration-tokens 4096 --no-profile
      ;;
    spec)
      run 420 "$log" $PY -m v4serve.bench.engine --hf-overrides '{"num_hidden_layers": 30}' --spec-verify \
        --spec-profile --routing uniform --concurrency 1 8 --cuda-graph-sizes 1 8 --spec-k 3 --spec-lengths 2.8 \
        --output-len 32 --max-model-len 4096
      ;;
    *) echo "unknown stage $stage" >&2 ;;
  esac
  summary+=("== $stage: $((SECONDS - t0)) s")
done
printf '%s\n' "${summary[@]}"
