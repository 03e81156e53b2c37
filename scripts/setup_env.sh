#!/usr/bin/env bash
# Sourced by demo.sh and test.sh: makes .venv (Python >= 3.12) and installs
# jax_mosaic_ffi into it with the given extras. Set JMF_PYTHON to choose the
# interpreter.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-test}"

find_python() {
  local candidates=("${JMF_PYTHON:-}" python3.13 python3.12 python3)
  candidates+=(/root/.pyenv/versions/3.1[2-9]*/bin/python "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python)
  for c in "${candidates[@]}"; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || [ -x "$c" ] || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}

if ! PY="$(find_python)"; then
  echo "error: jax_mosaic_ffi needs Python >= 3.12 (jax 0.11 does), and none was found." >&2
  echo "       Install one (e.g. pyenv install 3.12) or point JMF_PYTHON at it." >&2
  exit 1
fi

venv="$repo/.venv"
if [ ! -x "$venv/bin/python" ]; then
  echo "== creating $venv with $PY ($("$PY" --version))"
  "$PY" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
fi
echo "== installing jax_mosaic_ffi[$extras] (builds the C++ extension)"
"$venv/bin/python" -m pip install -q "$repo[$extras]"
export PATH="$venv/bin:$PATH"
