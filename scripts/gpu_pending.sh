#!/usr/bin/env bash
# What is merged but not yet run on a GPU (sessions 13-14: NOTES.md "Next session, first"), in
# stages that each fit one device call (<= 10 min), logs under $OUT, a summary table last.
# Usage (repo root, GPU machine): OUT=/some/dir scripts/gpu_pending.sh STAGE...
#   tests13 tests14a tests14b
#           the GPU tests of every unmeasured change, one pytest per group under its own limit
#           (GROUP_LIMIT, 180 s: a cold-compile group under one limit printed nothing in session 13)
#   tests   all groups of the three at once, one pytest process each (compiling is CPU-bound and
#           the host has 16 cores; correctness tests only, so sharing the GPU is harmless)
#   tests16 session 16's groups the same way (the failures of session 16's first call, the rules it
#           switched: o_a block-diagonal to 64 rows, the top-k kernel, MoE decode on tensor cores);
#           tests16b: the verify compressor (journal, channel slices), the offload plan's resident
#           rows, the shared SwiGLU's rows rule; tests17: session 17's top-k live bound and the
#           model / spec paths that call it
#   topk    the top-k's GPU tests, and the verify compressor's + state commit's (its table width now a
#           constexpr)
#   topk-live  the top-k with and without the live bound (`kernel_configs 'index topk live'`)
#   tests18 rows18  session 18: the GPU tests of the merge-bound top-k, the index scores' dead blocks
#           and the MoE's cp.async stages; their rows (top-k live, 'indexer decode B', 'moe staged');
#           tests18b / moe-staged: the MoE tests and rows once the cp.async ring is production
#   tests19 rows19  the decode's rounds (merge over > 32 splits, values over > 32 tiles) and the packed kernels
#   tests20 rows20  up to 8 picks of an expert a Gluon MoE program (GROUPED) against a program a pick;
#           rows20b: down as gate_up's programmatic dependent launch against plain launches
#   tests21 rows21  session 21: the MoE's ring past 48 picks (grouped) and its tests; the MoE's
#           grouped and dependent-launch rows ('moe grouped', 'moe pdl')
#   chain   session 21: route -> gate_up -> down -> combine as dependent launches (the GPU bit tests,
#           the tensor-core layer's tests, 'moe pdl'), ~2 min
#   rows    `bench kernels` rows of the changed kernels (sets the rules' thresholds), ~3 min
#   rows16  the o_a and launch-glue rows alone, ~1 min
#   sweeps-a sweeps-b
#           the kernel_configs sweeps whose winners are one-line production switches, ~6-7 min each
#   flash   the 43-layer V4-Flash end to end (Zipf, placement by use, offload auto), c1 / c8, ~2.5 min
#   flash-tc  the same with the MoE decode on tensor cores (`--moe-decode tensor-cores`)
#   v41     the V4.1 indexer sweep's decode and long-start shapes (as sweeps-b ends), ~1.5 min
#   flash-gemv  the same with the MoE decode on the GEMV (`--moe-decode gemv`)
#   flash-prefetch  the same with the layer-ahead expert prefetch (`--offload-prefetch`)
#   flash-profile   the same with the profiler's kernel table of the decode steps
#   flash-long      the same 2K context with max_model_len 131072 (top-k rows of 32768 columns);
#                   flash-long-profile: with the kernel table
#   bind    which MXFP4 layers bind the tensor-core route (2 Flash layers with host experts), ~1 min
#   moe-ab  the MoE decode route A/B end to end (`--moe-decode gemv`, then `tensor-cores`): 30 Flash
#           layers without offload, c1 / c8, ~4 min
#   c64     c64 decode, 30 Flash layers, production's MoE route, ~2 min
#   moe-c64 the MoE decode routes at c64 (tensor cores sort-free up to 1.5 E, the GEMV sorted), ~4 min
#   spec    speculative verify on 30 layers, c1 / c8, k = 3, ~3 min (spec-zipf: Zipf(1) routing)
#   rows32  the c8 k = 3 verify step under both 17..32-row FP8 rules (sum kernel / last program sums)
#   gluon22 the packed two-pass kernels in Gluon: their GPU tests, then the fp8kv B8 sweeps (rows and passes)
#   ncu22   Nsight Compute on those kernels at r4 B8 (ncu_gluon_*.txt: sections + stall samples), ~4 min
#   draft23 the MTP drafts' FP8 head (speculative_config draft_head "fp8"): its GPU test, then the
#           k = 3 step at c1 / c8 with the lm head vs the FP8 copy (30 layers; TPOT at 2.8 with fp8), ~5 min
# Files under $OUT: pending_<stage>.log (+ .json where the tool writes one); at most 8 come back.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, PYTHONPATH (with .gpu_deps), PY, gpu_env_line
(($#)) || { echo "usage: $0 bind|tests|tests13|tests14a|tests14b|tests16|tests16b|tests17|tests18|tests18b|tests19|tests20|tests21|rows21|chain|rows19|rows20|rows20b|rows18|moe-staged|topk|topk-live|rows|rows16|sweeps-a|sweeps-b|v41|flash|flash-tc|flash-gemv|flash-prefetch|flash-profile|flash-long|flash-long-profile|moe-ab|c64|moe-c64|spec|spec-zipf|rows32|gluon22|ncu22|draft23 ..." >&2; exit 2; }
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

# The test groups of each tests stage, one pytest each (pytest arguments, shell-quoted).
declare -A GROUPS_OF=(
  [tests13]="tests/ops/test_fp8_grouped_linear.py tests/model/test_o_a_fp8_gpu.py tests/ops/test_pick_columns.py
tests/ops/test_norm_rope.py tests/ops/test_indexer_kernel_gpu.py -k 'also_norm or weight_scale'
tests/model/test_gpu_paths.py"
  [tests14a]="tests/ops/test_fp8_linear_rows32.py tests/ops/test_fp8_linear_w8a16_decode.py
tests/ops/test_mxfp4_moe_decode.py tests/ops/test_mxfp4_gemv.py tests/model/test_quantized_gpu.py
tests/ops/test_packed_kernels_gpu.py -k variants"
  [tests14b]="tests/ops/test_index_topk.py
tests/ops/test_fp8_linear_swiglu.py tests/model/test_shared_expert_swiglu.py
tests/ops/test_mxfp4_moe_mma.py
tests/model/test_moe_tensor_core_decode.py
tests/model/test_offload_sort_free_gpu.py"
  [tests16]="tests/ops/test_fp8_grouped_linear.py tests/model/test_o_a_fp8_gpu.py
tests/ops/test_packed_kernels_gpu.py -k variants
tests/ops/test_index_topk.py
tests/model/test_quantized_gpu.py tests/model/test_moe_tensor_core_decode.py
tests/model/test_gpu_paths.py"
  [tests16b]="tests/ops/test_compress_verify.py tests/engine/test_gpu_spec_decode.py
tests/model/test_offload_sort_free_gpu.py tests/ops/test_expert_cache_ops.py
tests/ops/test_fp8_linear_swiglu.py tests/model/test_shared_expert_swiglu.py"
  [tests18]="tests/ops/test_index_topk.py tests/ops/test_compress_verify.py
tests/ops/test_indexer_kernel_gpu.py tests/ops/test_mxfp4_moe_mma.py
tests/model/test_gpu_paths.py tests/model/test_moe_tensor_core_decode.py"
  [tests19]="tests/ops/test_sparse_attn_modes.py
tests/ops/test_packed_kernels_gpu.py"
  [tests20]="tests/ops/test_mxfp4_moe_mma.py tests/ops/test_moe_pick_groups.py
tests/model/test_moe_tensor_core_decode.py
tests/model/test_offload_sort_free_gpu.py
tests/engine/test_gpu_spec_decode.py"
  [tests21]="tests/ops/test_mxfp4_moe_mma.py tests/ops/test_moe_pick_groups.py
tests/model/test_moe_tensor_core_decode.py
tests/model/test_offload_sort_free_gpu.py
tests/engine/test_gpu_spec_decode.py"
  [tests18b]="tests/ops/test_mxfp4_moe_mma.py
tests/model/test_moe_tensor_core_decode.py"
  [topk]="tests/ops/test_index_topk.py
tests/ops/test_compress_verify.py"
  [tests17]="tests/ops/test_index_topk.py
tests/model/test_gpu_paths.py
tests/engine/test_gpu_spec_decode.py"
)

test_groups() {  # test_groups LOG STAGE...: each group of the stages, one after another
  local log=$1 stage line
  shift
  for stage in "$@"; do
    while read -r line; do
      eval "pytest_group \"\$log\" $line"  # a group's words are its pytest arguments, quotes kept
    done <<< "${GROUPS_OF[$stage]}"
  done
}

parallel_test_groups() {  # parallel_test_groups LOG STAGE...: every group at once, logs appended in order
  local log=$1 stage line n=0 part
  shift
  for stage in "$@"; do
    while read -r line; do
      part="$log.$n"
      ( summary=(); eval "pytest_group \"\$part\" $line"; printf '%s\n' "${summary[@]}" > "$part.sum" ) &
      n=$((n + 1))
    done <<< "${GROUPS_OF[$stage]}"
  done
  wait
  for ((i = 0; i < n; i++)); do
    cat "$log.$i" >> "$log" && rm -f "$log.$i"
    mapfile -t lines < "$log.$i.sum" && summary+=("${lines[@]}") && rm -f "$log.$i.sum"
  done
}

for stage in "$@"; do
  t0=$SECONDS
  log="$OUT/pending_${stage}.log"
  gpu_env_line > "$log"
  case "$stage" in
    tests13 | tests14a | tests14b)  # s13: o_a in FP8, launch glue; s14: rows 17..32, sort-free MoE, B8
      test_groups "$log" "$stage"     # variants, index top-k, shared SwiGLU, MoE on tensor cores, offload sort-free
      ;;
    tests)
      parallel_test_groups "$log" tests13 tests14a tests14b
      ;;
    tests16 | tests16b | tests17 | tests18 | tests18b | tests19 | tests20 | tests21 | topk)
      parallel_test_groups "$log" "$stage"
      ;;
    topk-live)  # the top-k over a row's live prefix (n_live) against the whole row, ~1 min
      run 120 "$log" $PY -m v4serve.bench.kernel_configs 'index topk live'
      ;;
    gluon22)  # session 22: the packed two-pass kernels in Gluon (tests, then the B8 rows and passes with them)
      GROUP_LIMIT=300 pytest_group "$log" tests/ops/test_packed_kernels_gpu.py -k gluon  # (cold compiles)
      pytest_group "$log" tests/ops/test_mxfp4_moe_mma.py -k dependent  # (its PDL helpers and builtins moved to ops/gluon_builtins.py)
      for r in 4 128 0; do run 150 "$log" $PY -m v4serve.bench.kernel_configs "fp8kv r$r B8"; done
      ;;
    ncu22)  # session 22: Nsight Compute on the Gluon passes at r4 B8 (where their time goes, if they lose)
      run 500 "$log" scripts/gpu_ncu.sh \
        'gluon_values|decode fp8kv r4 B8|_values_packed_gluon_kernel|1|{"VALUES_KERNEL": "gluon"}' \
        'gluon_values_2wg|decode fp8kv r4 B8|_values_packed_gluon_kernel|1|{"VALUES_KERNEL": "gluon", "VALUE_WARPGROUPS": 2}' \
        'gluon_scores|decode fp8kv r4 B8|_scores_packed_gluon_kernel|1|{"SCORES_KERNEL": "gluon"}'
      ;;
    chain)  # session 21: the MoE's launches as one chain of dependent launches
      pytest_group "$log" tests/ops/test_mxfp4_moe_mma.py -k dependent
      pytest_group "$log" tests/model/test_moe_tensor_core_decode.py
      run 200 "$log" $PY -m v4serve.bench.kernel_configs 'moe pdl'
      ;;
    rows21)  # session 21: the MoE's ring past 48 picks (grouped, dependent launch)
      run 300 "$log" $PY -m v4serve.bench.kernel_configs 'moe grouped'
      run 200 "$log" $PY -m v4serve.bench.kernel_configs 'moe pdl'
      ;;
    rows20)  # session 20: up to 8 picks of an expert a Gluon program against a program a pick
      run 300 "$log" $PY -m v4serve.bench.kernel_configs 'moe grouped'
      ;;
    rows20b)  # session 20: down as gate_up's programmatic dependent launch against plain launches
      run 200 "$log" $PY -m v4serve.bench.kernel_configs 'moe pdl'
      ;;
    moe-staged)  # the MoE's cp.async rule (production) against the register loop, c1 / c8 / verify c32
      run 150 "$log" $PY -m v4serve.bench.kernel_configs 'moe staged'
      ;;
    rows19)  # session 19: B1 split-K over a wide table, the live split width against SMALL and LARGE
      run 150 "$log" $PY -m v4serve.bench.kernel_configs 'decode wide'
      ;;
    rows18)  # session 18: top-k live rows, index scores over a wide table, the MoE's cp.async stages
      run 120 "$log" $PY -m v4serve.bench.kernel_configs 'index topk live'
      run 120 "$log" $PY -m v4serve.bench.kernel_configs 'indexer decode B'
      run 150 "$log" $PY -m v4serve.bench.kernel_configs 'moe staged'
      ;;
    rows16)  # the o_a rule's rows and the launch-glue rows (session 16's first `rows` stopped there)
      run 120 "$log" $PY -m v4serve.bench.kernels --no-cold --json "$OUT/pending_rows16.json" --only 'o_a |glue '
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
      run 90 "$log" $PY -m v4serve.bench.kernel_configs 'cand decode|staged1M|start130944'
      ;;
    v41)  # the V4.1 indexer's decode / long-start shapes alone (sweeps-b's last line)
      run 90 "$log" $PY -m v4serve.bench.kernel_configs 'cand decode|staged1M|start130944'
      ;;
    flash | flash-tc | flash-gemv | flash-prefetch | flash-profile | flash-long | flash-long-profile)
      # flash: production; -tc / -gemv: that MoE decode route; -prefetch: the layer-ahead expert
      # guess (`--offload-prefetch`: loses, session 17); -profile: the kernel table of a decode step
      extra=(--no-profile)
      [[ $stage == flash-tc ]] && extra+=(--moe-decode tensor-cores)
      [[ $stage == flash-gemv ]] && extra+=(--moe-decode gemv)
      [[ $stage == flash-prefetch ]] && extra+=(--offload-prefetch)
      [[ $stage == flash-profile ]] && extra=()
      [[ $stage == flash-long-profile ]] && extra=()
      [[ $stage == flash-long* ]] && extra+=(--max-model-len 131072)  # the same 2K context in a 128K cache
      run 420 "$log" $PY -m v4serve.bench.engine --model deepseek-v4-flash --hf-overrides '{}' --cpu-offload-gb auto \
        --routing zipf --placement by-use --concurrency 1 8 --cuda-graph-sizes 1 8 --output-len 96 \
        --max-model-len 8448 --num-kv-pages 2200 --ttft-prompt-lens 2048 --ttft-repeats 1 \
        --calibration-tokens 4096 "${extra[@]}"
      ;;
    bind)  # which layers `bind_decode` puts on tensor cores: 2 Flash layers with host experts
      run 120 "$log" $PY -c "
import torch
from v4serve.model.loader import build_model
from v4serve.model.quantized import MXFP4Experts
net, _ = build_model('deepseek-v4-flash', 'cuda', torch.bfloat16, {'num_hidden_layers': 2}, progress=False,
                     cpu_offload_gb=1.0, tensor_core_decode=True)
for name, m in net.named_modules():
    if isinstance(m, MXFP4Experts):
        scales = m.stored('gate_up_proj_scale_inv') + m.stored('down_proj_scale_inv')
        print(name, 'tensor cores', m.tensor_core_decode, 'host experts', m.offload is not None,
              'scale maxima', [int(t.max()) for t in scales])"
      ;;
    moe-ab)
      for route in gemv tensor-cores; do
        run 280 "$log" $PY -m v4serve.bench.engine --hf-overrides '{"num_hidden_layers": 30}' --concurrency 1 8 \
          --cuda-graph-sizes 1 8 --output-len 96 --ttft-repeats 1 --no-profile --moe-decode "$route" \
          --json-out "$OUT/pending_moe_ab_$route.json"
      done
      ;;
    c64)  # c64 decode on 30 Flash layers at production's MoE route alone (moe-c64 without the GEMV arm)
      run 250 "$log" $PY -m v4serve.bench.engine --hf-overrides '{"num_hidden_layers": 30}' --concurrency 64 \
        --max-num-seqs 64 --cuda-graph-sizes 64 --output-len 32 --ttft-repeats 1 --no-profile \
        --json-out "$OUT/pending_c64.json"
      ;;
    moe-c64)  # the 1.5 E sort-free rule (tensor cores) and the SwiGLU row rule at c64, 30 Flash layers
      for route in tensor-cores gemv; do
        run 250 "$log" $PY -m v4serve.bench.engine --hf-overrides '{"num_hidden_layers": 30}' --concurrency 64 \
          --max-num-seqs 64 --cuda-graph-sizes 64 --output-len 32 --ttft-repeats 1 --no-profile --moe-decode "$route" \
          --json-out "$OUT/pending_moe_c64_$route.json"
      done
      ;;
    spec | spec-zipf)  # uniform routing (every expert equally likely) or Zipf(1) (skewed, as real routers)
      routing=uniform
      [[ $stage == spec-zipf ]] && routing=zipf
      run 420 "$log" $PY -m v4serve.bench.engine --hf-overrides '{"num_hidden_layers": 30}' --spec-verify \
        --spec-profile --routing "$routing" --concurrency 1 8 --cuda-graph-sizes 1 8 --spec-k 3 --spec-lengths 2.8 \
        --output-len 32 --max-model-len 4096
      ;;
    rows32)  # the verify step at c8 k = 3 (32 rows) with the 17..32-row FP8 linears' K split summed by a
      # second launch vs by the last program of each tile, 30 layers, graphs captured anew under each rule
      run 420 "$log" $PY -m v4serve.bench.engine --hf-overrides '{"num_hidden_layers": 30}' --spec-verify \
        --spec-profile --concurrency 8 --cuda-graph-sizes 8 --spec-k 3 --spec-lengths 2.8 --spec-e2e-k 3 \
        --spec-rows32 sum-kernel sum-last sum-kernel --output-len 32 --max-model-len 4096 \
        --json-out "$OUT/pending_rows32.json"
      ;;
    draft23)  # session 23: the drafts' head in FP8 (half the bytes of the 3 draft steps' lm head reads)
      pytest_group "$log" tests/engine/test_gpu_spec_decode.py -k eager_run
      pytest_group "$log" tests/engine/test_kv_cache_size.py "tests/engine/test_gpu_decode.py::test_enforce_eager_captures_nothing"
      run 120 "$log" $PY -m v4serve.bench.kernels --only 'draft_head'
      run 400 "$log" $PY -m v4serve.bench.engine --hf-overrides '{"num_hidden_layers": 30}' --spec-verify \
        --concurrency 1 8 --cuda-graph-sizes 1 8 --spec-k 3 --spec-lengths 2.8 --spec-e2e-k 3 \
        --spec-draft-head shared fp8 --output-len 32 --max-model-len 4096 --json-out "$OUT/pending_draft23.json"
      ;;
    *) echo "unknown stage $stage" >&2 ;;
  esac
  summary+=("== $stage: $((SECONDS - t0)) s")
done
printf '%s\n' "${summary[@]}"
