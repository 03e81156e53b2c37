#!/usr/bin/env bash
# Builds the wheel of this checkout (one cp312-abi3 wheel for every CPython
# >= 3.12) into build/wheelhouse/<hash of what goes into it>/, unless it is
# there already, and prints its path. Used by CI and tests/test_install.py.
#   JMF_PYTHON  the Python >= 3.12 whose pip builds it (default: the venv's
#               that scripts/setup_env.sh made)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
hash="$(
  { find csrc jax_mosaic_ffi -type f ! -path '*/__pycache__/*' ! -name '*.so'
    echo CMakeLists.txt; echo pyproject.toml; echo README.md; } | LC_ALL=C sort | xargs sha256sum |
  sha256sum | cut -c1-16)"
dir="build/wheelhouse/$hash"
if ! compgen -G "$dir/jax_mosaic_ffi-*.whl" >/dev/null; then
  py="${JMF_PYTHON:-${JMF_VENV:-$repo/.venv}/bin/python}"
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    echo "error: no Python >= 3.12 at $py: set JMF_PYTHON, or run scripts/test.sh first to make .venv" >&2
    exit 1
  fi
  rm -rf build/wheelhouse  # wheels of older sources
  echo "== building the wheel into $dir" >&2
  "$py" -m pip wheel -q --no-deps . -w "$dir" >&2
fi
echo "$repo/$(ls "$dir"/jax_mosaic_ffi-*.whl)"
