#!/usr/bin/env bash
# Sourced by demo.sh and test.sh: makes a venv (Python >= 3.12) and installs
# jax_mosaic_ffi into it, editable, with the given extras.
#
# Editable (scikit-build-core's redirect mode): the venv holds the compiled
# extension, and `import jax_mosaic_ffi` reads the Python files of this
# checkout, so Python edits (new modules included) take effect at once. The
# install, which builds the C++ extension, is skipped when nothing it depends
# on changed since the last one: the stamp in the venv hashes csrc/,
# CMakeLists.txt and pyproject.toml (and the jax pin); the extras installed are kept beside it.
#
#   JMF_PYTHON  the interpreter to make the venv with (else the newest >= 3.12 found)
#   JMF_VENV    the venv (default .venv in the checkout)
#   JMF_JAX     pin jax and jaxlib to this version (default: the newest pip finds in range)
#   JMF_WHEEL   install this wheel instead (not editable, nothing built; CI's second venv)
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

# Everything the compiled extension and the installed metadata come from.
build_stamp() {
  (
    cd "$repo"
    { find csrc -type f; echo CMakeLists.txt; echo pyproject.toml; } | LC_ALL=C sort | xargs sha256sum
    echo "jax=${JMF_JAX:-} wheel=${JMF_WHEEL:-} checkout=$repo"
  ) | sha256sum | cut -d' ' -f1
}

venv="${JMF_VENV:-$repo/.venv}"
stamp_file="$venv/.jax_mosaic_ffi-install-stamp"
stamp="$(build_stamp)"
# The extras installed so far: the demo (test) and the tests (test,triton)
# share a venv, so a run asking for fewer extras than are there installs nothing.
extras_file="$venv/.jax_mosaic_ffi-install-extras"
installed_extras="$(cat "$extras_file" 2>/dev/null || true)"
extras_union="$(echo "$installed_extras,$extras" | tr ',' '\n' | sed '/^$/d' | LC_ALL=C sort -u | paste -sd, -)"
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] &&
   [ "$extras_union" = "$installed_extras" ] &&
   compgen -G "$venv/lib/python3*/site-packages/jax_mosaic_ffi/_core*.so" >/dev/null; then
  echo "== jax_mosaic_ffi is up to date in $venv (no change in csrc/, CMakeLists.txt or pyproject.toml)"
else
  if [ ! -x "$venv/bin/python" ]; then
    if ! PY="$(find_python)"; then
      echo "error: jax_mosaic_ffi needs Python >= 3.12 (jax 0.11 does), and none was found." >&2
      echo "       Install one (e.g. pyenv install 3.12) or point JMF_PYTHON at it." >&2
      exit 1
    fi
    echo "== creating $venv with $PY ($("$PY" --version))"
    "$PY" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
  fi
  pins=()
  [ -z "${JMF_JAX:-}" ] || pins=("jax==$JMF_JAX" "jaxlib==$JMF_JAX")
  rm -f "$stamp_file"
  extras="$extras_union"
  if [ -n "${JMF_WHEEL:-}" ]; then
    echo "== installing $(basename "$JMF_WHEEL")[$extras]${pins:+ ${pins[*]}} into $venv"
    "$venv/bin/python" -m pip install -q "$JMF_WHEEL[$extras]" "${pins[@]}"
    # Same version number, new build: pip would call it already satisfied.
    "$venv/bin/python" -m pip install -q --force-reinstall --no-deps "$JMF_WHEEL"
  else
    # Said here rather than after a page of CMake output.
    if [ -z "${CXX:-}" ] && ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1 &&
       ! command -v clang++ >/dev/null 2>&1; then
      echo "error: building jax_mosaic_ffi's C++ extension needs a C++20 compiler, and none was found." >&2
      echo "       Install one (Debian/Ubuntu: apt-get install g++; Fedora: dnf install gcc-c++) or set CXX." >&2
      exit 1
    fi
    echo "== installing jax_mosaic_ffi[$extras]${pins:+ ${pins[*]}} into $venv (editable; builds the C++ extension)"
    "$venv/bin/python" -m pip install -q -e "$repo[$extras]" "${pins[@]}"
  fi
  echo "$stamp" > "$stamp_file"
  echo "$extras" > "$extras_file"
fi
export PATH="$venv/bin:$PATH"
