#!/usr/bin/env bash
# Install v4serve with its test extras into .venv, run the CPU test suite, then the compile-only
# codegen check of every Triton kernel under each Triton release CI covers.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 -m venv .venv
# torch 2.13.0 is named explicitly: it resolves to the CPU build on the CI image.
.venv/bin/pip install -q torch==2.13.0 -e '.[test]'

# Tiny models run several times faster on one thread than on two contended ones.
OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q  # exits non-zero if no test is collected

scripts/codegen_check.sh 3.6.0 3.8.0 3.9.0
