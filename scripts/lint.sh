#!/usr/bin/env bash
# Style and layering checks, as CI runs them: ruff for Python (style, imports at the top, no private access
# across modules), import-linter for the layers of jax_mosaic_ffi/ (pyproject.toml, docs/architecture.md),
# scripts/check_csrc_layers.py for the folders of csrc/, scripts/check_file_sizes.py for the size of each file
# (400 lines at most in jax_mosaic_ffi/ and csrc/), clang-format for csrc/ and the fuzz driver.
# Fix with: ruff check --fix . && clang-format -i $(find csrc -name '*.cc' -o -name '*.h') tests/fuzz/*.cc
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
bin="${JMF_VENV:-$repo/.venv}/bin"
"$bin/python" -m pip install -q "ruff>=0.6" "clang-format>=18" "import-linter>=2" 2>&1 | grep -v "^WARNING: Location" || true
"$bin/ruff" check .
# From the checkout, whose jax_mosaic_ffi/ it reads (the venv may hold an installed wheel instead).
(cd "$repo" && PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}" "$bin/lint-imports")
"$bin/clang-format" --dry-run --Werror $(find csrc -name '*.cc' -o -name '*.h' | LC_ALL=C sort) tests/fuzz/*.cc
"$bin/python" scripts/check_csrc_layers.py
"$bin/python" scripts/check_file_sizes.py
echo "style: ruff, import-linter, csrc layers, file sizes and clang-format clean"
