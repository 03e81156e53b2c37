#!/usr/bin/env bash
# Packs Python packages for the GPU machine, which has no network and takes at most 64 MiB per call.
# Here (with network):
#   bash scripts/carry_pack.sh NAME [--drop GLOB]... PKG==VER [PKG==VER...]
# downloads the cp312 manylinux wheels (no dependencies), unpacks them into one site folder, drops what
# --drop names (paths under that folder, e.g. Triton's AMD backend library, which the H200 never loads),
# compresses it (xz: unpacked wheels shrink by about 30% more than the wheels themselves) and cuts it into
# .carry/NAME.part-NN of at most 59 MiB, with .carry/NAME.sha256 beside them. It prints one carry list per call.
# There, every call of scripts/gpu_check.sh first moves the parts it was carried out of the tree (which the
# next call replaces) into a stash that outlives the call; JMF_CARRIED="NAME..." then unpacks the named bundles
# and puts them first on the tests' and benchmarks' path. docs/compatibility.md says how.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
name=${1:?usage: carry_pack.sh NAME [--drop GLOB]... PKG==VER...}; shift
[[ "$name" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "error: NAME is letters, digits, _ and - only" >&2; exit 2; }
drops=() pkgs=()
while [ $# -gt 0 ]; do
  case "$1" in
    --drop) drops+=("$2"); shift 2 ;;
    *) pkgs+=("$1"); shift ;;
  esac
done
[ "${#pkgs[@]}" -gt 0 ] || { echo "error: no packages named" >&2; exit 2; }
source "$repo/scripts/find_python.sh"
py="$(find_python)" || exit 1  # pip finds cp312 wheels for a Python >= 3.12
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux2014_x86_64 --platform linux_x86_64 -d "$work/wheels" "${pkgs[@]}"
mkdir -p "$work/site"
for wheel in "$work"/wheels/*.whl; do "$py" -m zipfile -e "$wheel" "$work/site"; done
for glob in "${drops[@]}"; do
  # shellcheck disable=SC2086  # the glob is meant to expand
  (cd "$work/site" && rm -rf -- $glob)
done
find "$work/site" -path '*/bin/*' -type f -exec chmod +x {} +  # zipfile drops the executable bit
mkdir -p "$repo/.carry"
rm -f "$repo/.carry/$name".part-* "$repo/.carry/$name.sha256"
tar -C "$work/site" -cf - . | xz -T0 -6 | split -b 59M -d -a 2 - "$repo/.carry/$name.part-"
(cd "$repo/.carry" && cat "$name".part-* | sha256sum | cut -d' ' -f1 > "$name.sha256")
echo "$name: $(ls "$repo/.carry/$name".part-* | wc -l) parts of at most 59 MiB, one per call:"
for part in "$repo/.carry/$name".part-*; do echo "  carry [\".carry/${part##*/}\", \".carry/$name.sha256\"]"; done
