#!/usr/bin/env bash
# Install v4serve with its test extras into .venv, run the CPU test suite, then the compile-only
# codegen check of every Triton kernel under each Triton release CI covers.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
# torch 2.13.0 is named explicitly: it resolves to the CPU build on the CI image.
.venv/bin/pip install -q torch==2.13.0 -e '.[test]'

# Both stages always run (a failing test must not hide the codegen check); the script fails if
# either does. Tiny models run several times faster on one thread than on two contended ones.
t0=$SECONDS pytest_rc=0 codegen_rc=0
OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q || pytest_rc=$?  # non-zero also if nothing is collected
t1=$SECONDS
scripts/codegen_check.sh 3.6.0 3.8.0 3.9.0 || codegen_rc=$?
echo "[test.sh] pytest $((t1 - t0)) s (exit $pytest_rc), codegen check $((SECONDS - t1)) s (exit $codegen_rc)" >&2
((pytest_rc == 0 && codegen_rc == 0))
