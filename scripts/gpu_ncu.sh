#!/usr/bin/env bash
# Nsight Compute on named `bench kernels` shapes (GPU machine, development tool): per case the
# SpeedOfLight / Occupancy / SchedulerStats / WarpStateStats sections and the stall samples by SASS
# instruction (scripts/ncu_stalls.py).
# Usage (repo root): OUT=/some/dir scripts/gpu_ncu.sh 'TAG|SHAPE|KERNEL_REGEX|LAUNCHES|CONFIG' ...
# LAUNCHES: how many matching launches to profile after the first call's (default 1). CONFIG (JSON,
# optional): a kernel_configs decode shape at production's tiles updated by it (scripts/ncu_config.py).
# Each case's two reports go to one file, ncu_<tag>.txt (the device tool brings back at most 8 files).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_env.sh"  # OUT, PYTHONPATH (with .gpu_deps), PY, gpu_env_line
for spec in "$@"; do
  IFS='|' read -r tag shape kernel count config <<< "$spec"
  count=${count:-1}
  driver=(scripts/ncu_shape.py "$shape")
  [[ -n "${config:-}" ]] && driver=(scripts/ncu_config.py "$shape" "$config")
  t0=$SECONDS
  common=(--clock-control none -k "regex:$kernel" --launch-skip "$((count * 2))" --launch-count "$count")
  { gpu_env_line; echo "# $shape / $kernel"; } > "$OUT/ncu_$tag.txt"
  timeout 150 ncu "${common[@]}" --section SpeedOfLight --section Occupancy --section SchedulerStats \
    --section WarpStateStats --section LaunchStats \
    $PY "${driver[@]}" >> "$OUT/ncu_$tag.txt" 2>&1
  timeout 150 ncu "${common[@]}" --section SourceCounters --section WarpStateStats --page source \
    --print-source sass --csv $PY "${driver[@]}" > "$OUT/ncu_$tag.csv" 2>&1
  { echo "# stall samples"; $PY scripts/ncu_stalls.py "$OUT/ncu_$tag.csv"; } >> "$OUT/ncu_$tag.txt" 2>&1
  rm -f "$OUT/ncu_$tag.csv"
  echo "== $tag: $((SECONDS - t0)) s"
done
