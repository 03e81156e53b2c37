#!/usr/bin/env bash
# Compares the XLA FFI headers of two jaxlib releases: what to read before
# widening the supported range (docs/compatibility.md).
#   bash scripts/compare_ffi_headers.sh 0.11.2 0.12.0.1 [scratch dir]
# Downloads the two cp312 manylinux x86_64 wheels (headers only are used) to
# the scratch dir, outside the repo, prints the version macros, then the diff.
set -euo pipefail
old="${1:?usage: compare_ffi_headers.sh OLD NEW [DIR]}"; new="${2:?usage: compare_ffi_headers.sh OLD NEW [DIR]}"
dir="${3:-${TMPDIR:-/tmp}/jmf-ffi-headers}"
source "$(dirname "${BASH_SOURCE[0]}")/find_python.sh"
PY="$(find_python)" || exit 1
mkdir -p "$dir"
for v in "$old" "$new"; do
  if [ ! -d "$dir/$v" ]; then
    "$PY" -m pip download -q --no-deps "jaxlib==$v" --python-version 3.12 \
      --platform manylinux_2_27_x86_64 --only-binary=:all: -d "$dir/wheels"
    "$PY" -m zipfile -e "$(ls "$dir"/wheels/jaxlib-"$v"-*.whl)" "$dir/$v.tmp"
    mv "$dir/$v.tmp/jaxlib/include/xla/ffi/api" "$dir/$v"; rm -rf "$dir/$v.tmp"
  fi
done
for v in "$old" "$new"; do
  echo "== jaxlib $v"
  grep -h -E '#define XLA_FFI_(API_MAJOR|API_MINOR|Extension_[A-Za-z]+_(Major|Minor)Version)' "$dir/$v"/*.h
done
diff -ru "$dir/$old" "$dir/$new" || true
