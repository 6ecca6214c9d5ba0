#!/usr/bin/env bash
# Issue 18 end to end on one H200: the full DeepSeek-V4-Flash (43 layers, 256 MXFP4 experts, FP8
# linears; random weights in the official formats) with `--cpu-offload-gb auto`, uniform routing
# (static placement), then Zipf-skewed routing with the experts placed by measured use; V4-Pro cut
# to 9 of its 61 layers (fits without offload); V4-Pro cut to 12 layers with auto offload (Zipf,
# placement by use). Per run: load time, memory map, TTFT (2K, 8K prompts), TPOT / output tok/s
# at each concurrency, measured expert use and expert fetches per decode step.
# Usage (repo root, GPU machine): OUT=/some/dir scripts/gpu_flash_e2e.sh [STAGE ...]
#   STAGE: tests | flash | pro | pro-offload | overlap (default: flash pro pro-offload, ~9 min in all)
#   overlap: the offload pass schedule: resident pass beside the fetch (default), without it, and with
#            the layer-ahead prefetch (Flash cut to 8 layers, 3 x ~1 min)
#   tests: the GPU tests of the offload path (fetch kernel on pinned memory in a graph; offloaded
#          Flash cut to 4 layers in CUDA graphs = resident tokens; ~2-3 min, run it first)
# Files under $OUT (at most 8 come back): e2e_<stage>.log, e2e_<stage>.json.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, PYTHONPATH (with .gpu_deps), PY, gpu_env_line
STAGES=("$@")
[[ ${#STAGES[@]} -eq 0 ]] && STAGES=(flash pro pro-offload)
BENCH="$PY -m v4serve.bench.engine --max-model-len 8448 --max-num-batched-tokens 2048 --ttft-prompt-lens 2048 8192"
# 2200 KV pages (32 sequences of 8448 tokens; auto offload keeps exactly this free) rather than 85% of
# whatever is free: the rest stays for prefill activations and the decode graphs.
BENCH="$BENCH --ttft-repeats 2 --no-profile --num-kv-pages 2200"
for stage in "${STAGES[@]}"; do
  t0=$SECONDS
  log="$OUT/e2e_${stage}.log"
  gpu_env_line > "$log"
  case "$stage" in
    tests)
      timeout ${TESTS_LIMIT:-300} $PY -m pytest -m gpu -q -s -p no:cacheprovider tests/ops/test_expert_cache_ops.py \
        "tests/model/test_quantized_gpu.py::test_flash_offload_decodes_in_cuda_graphs_with_the_resident_tokens" \
        "tests/model/test_quantized_gpu.py::test_flash_official_formats_with_offload_match_no_offload" 2>&1 \
        | tee -a "$log" | grep -E 'passed|failed|Error|calibration|build' | tail -n 20 ;;
    flash)
      timeout ${FLASH_LIMIT:-330} $BENCH --model deepseek-v4-flash --hf-overrides '{}' --cpu-offload-gb auto \
        --concurrency 1 8 32 --cuda-graph-sizes 1 8 32 --output-len 96 --routing uniform zipf --zipf-exponent 1.0 \
        --placement static by-use --calibration-tokens 4096 --json-out "$OUT/e2e_flash.json" 2>&1 \
        | tee -a "$log" | grep -v -E '^\{' | tail -n 40 ;;
    pro)
      timeout ${PRO_LIMIT:-100} $BENCH --model deepseek-v4-pro --hf-overrides '{"num_hidden_layers": 9}' \
        --concurrency 1 8 32 --cuda-graph-sizes 1 8 32 --output-len 64 --json-out "$OUT/e2e_pro.json" 2>&1 \
        | tee -a "$log" | grep -v -E '^\{' | tail -n 30 ;;
    pro-offload)
      timeout ${PRO_OFFLOAD_LIMIT:-130} $BENCH --model deepseek-v4-pro --hf-overrides '{"num_hidden_layers": 12}' \
        --cpu-offload-gb auto --concurrency 1 8 --cuda-graph-sizes 1 8 --output-len 64 --routing zipf \
        --placement by-use --calibration-tokens 2048 --json-out "$OUT/e2e_pro_offload.json" 2>&1 \
        | tee -a "$log" | grep -v -E '^\{' | tail -n 30 ;;
    overlap)
      # offload pass schedule side by side: Flash cut to 8 layers, 120 of 256 experts per layer on the host
      for flag in "" --no-offload-overlap --offload-prefetch; do
        timeout ${OVERLAP_LIMIT:-100} $BENCH --model deepseek-v4-flash --hf-overrides '{"num_hidden_layers": 8}' \
          --cpu-offload-gb 12 --concurrency 1 8 --cuda-graph-sizes 1 8 --output-len 64 \
          --ttft-prompt-lens 2048 --ttft-repeats 1 $flag 2>&1 | tee -a "$log" | grep -E 'routing|concurrency|^ +[0-9]+ ' | tail -n 8
      done ;;
    *) echo "unknown stage $stage" ;;
  esac
  echo "== stage $stage: $((SECONDS - t0)) s" | tee -a "$log"
done
