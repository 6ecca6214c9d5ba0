#!/usr/bin/env bash
# CI stage: compile every registered Triton kernel without a GPU under one Triton version and
# check its machine code (docs/codegen.md).
#
#   scripts/codegen_check.sh 3.8.0 [extra args for python -m v4serve.codegen]
#
# Creates or reuses .venv-triton-VERSION (scripts/make_triton_env.sh), runs the codegen tests
# (the unhinted tl.where gather must fail under >= 3.8 and pass under 3.6), then
# `python -m v4serve.codegen --check`, writing the JSON record to
# .venv-triton-VERSION/codegen-report.json. Triton's compile cache is kept per version.
set -euo pipefail

version=${1:?usage: $0 TRITON_VERSION [args]}
shift
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

t0=$SECONDS
venv=$(scripts/make_triton_env.sh "$version" | tail -n 1)
t_env=$((SECONDS - t0))

export TRITON_CACHE_DIR="$venv/triton-cache"
export TRITON_DEFAULT_FP_FUSION=1  # Triton 3.9's default, stated so that it does not warn
unset TRITON_INTERPRET

# --noconftest: tests/conftest.py sets up the interpreter for the pinned Triton only.
# Both steps always run; the stage fails if either does.
t1=$SECONDS
tests=0
"$venv/bin/python" -m pytest -q --noconftest -p no:cacheprovider \
    tests/test_codegen.py tests/test_codegen_parse.py || tests=$?
t_test=$((SECONDS - t1))

t2=$SECONDS
report=0
"$venv/bin/python" -m v4serve.codegen --check --json "$venv/codegen-report.json" "$@" || report=$?
t_check=$((SECONDS - t2))

echo "[codegen_check] triton $version: venv ${t_env}s, tests ${t_test}s (exit $tests)," \
     "report ${t_check}s (exit $report)" >&2
((tests == 0 && report == 0))
