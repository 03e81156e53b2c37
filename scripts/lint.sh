#!/usr/bin/env bash
# Style checks, as CI runs them: ruff for Python, clang-format for csrc/ and the fuzz driver.
# Fix with: ruff check --fix . && clang-format -i $(find csrc -name '*.cc' -o -name '*.h') tests/fuzz/*.cc
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bin="${JMF_VENV:-$repo/.venv}/bin"
"$bin/python" -m pip install -q "ruff>=0.6" "clang-format>=18" 2>&1 | grep -v "^WARNING: Location" || true
"$bin/ruff" check .
"$bin/clang-format" --dry-run --Werror $(find csrc -name '*.cc' -o -name '*.h' | LC_ALL=C sort) tests/fuzz/*.cc
"$bin/python" scripts/check_csrc_layers.py
echo "style: ruff and clang-format clean"
