#!/usr/bin/env bash
# Create (or reuse) .venv-triton-VERSION: CPU torch 2.13.0, triton==VERSION, numpy, pytest, the
# project's other runtime dependencies, and the project itself (editable, --no-deps).
#
#   scripts/make_triton_env.sh 3.8.0        # prints the venv path on its last line
#
# A venv is reused when its triton has the requested version (otherwise only triton and numpy
# are swapped, in seconds) and the runtime dependencies are reinstalled only when pyproject.toml
# changes. PYTHON picks the interpreter (default python3; the project needs 3.11 or newer).
set -euo pipefail

version=${1:?usage: $0 TRITON_VERSION}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv-triton-$version"
python=${PYTHON:-python3}
pip_q=(-q --no-compile)

# NOTE: Triton 3.6's interpreter breaks with numpy >= 2.4; 3.8 and 3.9 work with it.
case "$version" in
    3.[0-6].*) numpy_spec="numpy<2.4" ;;
    *) numpy_spec="numpy" ;;
esac

installed_triton() {
    "$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("triton"))' 2>/dev/null || true
}

if [[ ! -x "$venv/bin/python" ]]; then
    echo "[make_triton_env] creating $venv" >&2
    "$python" -m venv "$venv"
    "$venv/bin/pip" install "${pip_q[@]}" torch==2.13.0 "triton==$version" "$numpy_spec" pytest >&2
elif [[ "$(installed_triton)" != "$version" ]]; then
    echo "[make_triton_env] switching $venv to triton $version" >&2
    "$venv/bin/pip" install "${pip_q[@]}" "triton==$version" "$numpy_spec" >&2
fi

# The package's __init__ imports the engine, so the other runtime dependencies must be there;
# torch, triton and numpy stay as pinned above.
stamp="$venv/.v4serve-deps"
want=$(sha256sum "$root/pyproject.toml" | cut -c1-16)
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" ]]; then
    mapfile -t deps < <("$venv/bin/python" - "$root/pyproject.toml" <<'PY'
import re, sys, tomllib
for dep in tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]:
    if re.split(r"[\s<>=!~;\[]", dep, maxsplit=1)[0].lower() not in ("torch", "triton", "numpy"):
        print(dep)
PY
    )
    if ((${#deps[@]})); then
        "$venv/bin/pip" install "${pip_q[@]}" "${deps[@]}" "triton==$version" "$numpy_spec" >&2
    fi
    # The editable install writes $root/v4serve.egg-info: one venv at a time (codegen_check.sh
    # builds several at once).
    flock "$root" "$venv/bin/pip" install "${pip_q[@]}" --no-deps -e "$root" >&2
    echo "$want" > "$stamp"
fi
echo "$venv"
