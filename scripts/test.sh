#!/usr/bin/env bash
# Install v4serve with its test extras into .venv, run the CPU test suite, then the compile-only
# codegen check of every Triton kernel under each Triton release CI covers.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
# torch 2.13.0 is named explicitly: it resolves to the CPU build on the CI image.
.venv/bin/pip install -q torch==2.13.0 -e '.[test]'

# The codegen check's Triton venvs build (downloads and disk, mostly) while the CPU suite runs:
# one thread of pytest leaves a core to pip. codegen_check.sh reuses them (and retries a failed one).
triton_versions=(3.6.0 3.8.0 3.9.0)
venv_logs=$(mktemp -d)
for version in "${triton_versions[@]}"; do
    scripts/make_triton_env.sh "$version" > "$venv_logs/$version.log" 2>&1 &
done

# Both stages always run (a failing test must not hide the codegen check); the script fails if
# either does. Tiny models run several times faster on one thread than on two contended ones.
t0=$SECONDS pytest_rc=0 codegen_rc=0
OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q || pytest_rc=$?  # non-zero also if nothing is collected
t1=$SECONDS
wait  # the venv builds: two pip runs must never share a venv
scripts/codegen_check.sh "${triton_versions[@]}" || codegen_rc=$?
echo "[test.sh] pytest $((t1 - t0)) s (exit $pytest_rc), codegen check $((SECONDS - t1)) s (exit $codegen_rc)" >&2
((pytest_rc == 0 && codegen_rc == 0))
