#!/usr/bin/env bash
# CI stage: compile every registered Triton kernel without a GPU under each given Triton version
# and check its machine code (docs/codegen.md).
#
#   scripts/codegen_check.sh 3.6.0:90 3.8.0:90 3.9.0 [extra args for python -m v4serve.codegen]
#
# VERSION:ARCHS compiles for those archs only (`--arch ARCHS`, comma-separated SM numbers);
# a bare VERSION compiles for every default arch (sm_80, sm_90, sm_100, sm_120). CI checks sm_80,
# sm_90 and sm_100 under the newest Triton and only sm_90, the GPU we run, under the older ones.
#
# Creates or reuses .triton-VERSION for every version at once (scripts/make_triton_env.sh: the
# triton wheel alone, put in front of .venv on PYTHONPATH; pip mostly waits on downloads and
# disk, so they install side by side), then, as each is ready and one version after the other,
# runs tests/test_codegen.py under it (the unhinted tl.where gather must fail under >= 3.8 and
# pass under 3.6) and `python -m v4serve.codegen --check`, which writes its JSON record to
# .triton-VERSION/codegen-report.json. Triton's compile cache is kept per version. tests/test_codegen_parse.py does not depend on Triton: the main
# test suite runs it.
set -euo pipefail

versions=()
declare -A arch_args
while (($#)) && [[ $1 =~ ^([0-9]+\.[0-9]+\.[0-9]+)(:([0-9]+(,[0-9]+)*))?$ ]]; do
    versions+=("${BASH_REMATCH[1]}")
    arch_args[${BASH_REMATCH[1]}]=${BASH_REMATCH[3]:+--arch ${BASH_REMATCH[3]}}
    shift
done
((${#versions[@]})) || { echo "usage: $0 TRITON_VERSION[:ARCHS]... [args]" >&2; exit 2; }
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

export TRITON_DEFAULT_FP_FUSION=1  # Triton 3.9's default, stated so that it does not warn
unset TRITON_INTERPRET

# Tests, then the check, under one Triton. Both always run; it fails if either does.
check() {
    local version=$1 dir=$2
    shift 2
    local archs=${arch_args[$version]:-every default arch}
    local -x TRITON_CACHE_DIR="$dir/triton-cache" PYTHONPATH="$dir/site"
    local t1=$SECONDS tests=0
    # --noconftest: tests/conftest.py sets up the interpreter for the pinned Triton only.
    .venv/bin/python -m pytest -q --noconftest -p no:cacheprovider tests/test_codegen.py || tests=$?
    local t2=$SECONDS report=0
    .venv/bin/python -m v4serve.codegen --check --json "$dir/codegen-report.json" "$@" || report=$?
    echo "[codegen_check] triton $version ($archs): tests $((t2 - t1))s (exit $tests)," \
         "report $((SECONDS - t2))s (exit $report)" >&2
    ((tests == 0 && report == 0))
}

paths=$(mktemp -d)
trap 'rm -rf "$paths"' EXIT
declare -A env_pid
for version in "${versions[@]}"; do
    scripts/make_triton_env.sh "$version" > "$paths/$version" &
    env_pid[$version]=$!
done

status=0
for version in "${versions[@]}"; do
    if wait "${env_pid[$version]}"; then
        echo "[codegen_check] triton $version: ready at ${SECONDS}s" >&2
        # shellcheck disable=SC2086 # "--arch LIST" or nothing: two words or none
        check "$version" "$(tail -n 1 "$paths/$version")" ${arch_args[$version]} "$@" || status=1
    else
        echo "[codegen_check] triton $version: installing it failed" >&2
        status=1
    fi
done
echo "[codegen_check] ${versions[*]}: ${SECONDS}s (exit $status)" >&2
exit "$status"
