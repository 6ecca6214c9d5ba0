#!/usr/bin/env bash
# Create (or reuse) .triton-VERSION: a folder whose site/ holds only triton==VERSION, to be put
# first on PYTHONPATH in front of the project's .venv (which supplies torch, numpy, pytest and
# v4serve itself). When .venv's own triton is VERSION, site/ stays empty.
#
#   scripts/make_triton_env.sh 3.8.0        # prints the folder's path on its last line
#
# Only the triton wheel is installed (--no-deps, no pip cache): three venvs with a torch each
# ran CI's disk out of space. The folder also holds the version's compile cache and codegen
# report (scripts/codegen_check.sh). It is reused while its triton has the requested version.
set -euo pipefail

version=${1:?usage: $0 TRITON_VERSION}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python="$root/.venv/bin/python"
dir="$root/.triton-$version"
[[ -x $python ]] || { echo "[make_triton_env] $python is missing: run scripts/test.sh first" >&2; exit 1; }

triton_version() {  # the triton that `PYTHONPATH=$1 .venv/bin/python` imports
    PYTHONPATH=$1 "$python" -c 'import importlib.metadata as m; print(m.version("triton"))' 2>/dev/null || true
}

mkdir -p "$dir"
if [[ "$(triton_version "$dir/site")" != "$version" ]]; then
    rm -rf "$dir/site" "$dir/site.partial"
    if [[ "$(triton_version "")" != "$version" ]]; then
        echo "[make_triton_env] installing triton $version into $dir/site" >&2
        "$python" -m pip install -q --no-compile --no-deps --no-cache-dir \
            --target "$dir/site.partial" "triton==$version" >&2
        mv "$dir/site.partial" "$dir/site"
    else
        mkdir "$dir/site"  # .venv's own triton is this version
    fi
fi
echo "$dir"
