#!/usr/bin/env bash
# Builds the release artifacts of this checkout into dist/: the sdist and one
# cp312-abi3-manylinux_2_28_x86_64 wheel (nanobind's stable ABI: every CPython
# >= 3.12; glibc >= 2.28: any Linux of the last years), prints their paths,
# tags and sizes, and `auditwheel show`'s verdict. The last line printed is the
# wheel's path (CI and tests/test_install.py read it). Nothing is rebuilt when
# the sources are those of the last build (build/release/<hash>/).
#
# The tools are those of the ecosystem, pinned in scripts/release-requirements.txt
# and installed into build/release-tools/:
# - `python -m build`: the sdist, then the wheel built from that sdist by
#   scikit-build-core with the pinned build requirements of pyproject.toml;
# - the C++ compiler is zig's clang (the `ziglang` package) targeting glibc
#   2.28 (`-target x86_64-linux-gnu.2.28`), with its libc++ linked statically:
#   the system's gcc links against this machine's glibc and libstdc++, whose
#   symbol versions (dlopen@GLIBC_2.34, GLIBCXX_3.4.29...) no manylinux_2_28
#   system has, and without a manylinux container (no docker here) there is no
#   older sysroot to build against;
# - `abi3audit`: the extension calls CPython's limited API of 3.12 only (abi3);
# - `auditwheel repair --plat manylinux_2_28_x86_64 --only-plat`: checks the
#   extension's symbol versions and libraries against the policy and retags the
#   wheel. --only-plat: the tag is the glibc we build for, even where today's
#   code happens to need less (auditwheel show may then name an older
#   manylinux, which the check below accepts). The
#   CUDA driver (libcuda.so.1) is the user's: we dlopen it, never link it, and
#   --exclude keeps it out should a link to it ever appear.
#   JMF_PYTHON  the Python >= 3.12 for the tools' venv (default: .venv's, else the one scripts/find_python.sh finds)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
plat=manylinux_2_28_x86_64
glibc=2.28

source "$repo/scripts/find_python.sh"
py="${JMF_VENV:-$repo/.venv}/bin/python"
if [ -n "${JMF_PYTHON:-}" ] || ! _jmf_python_says "$py" >/dev/null; then
  py="$(find_python)" || exit 1
fi

# The release tools, once per version of their pins.
tools="$repo/build/release-tools"
tools_stamp="$(sha256sum scripts/release-requirements.txt | cut -c1-16)"
if [ "$(cat "$tools/.stamp" 2>/dev/null)" != "$tools_stamp" ]; then
  echo "== installing the release tools (scripts/release-requirements.txt) into $tools" >&2
  rm -rf "$tools"
  # The tools' venv is built from the base interpreter: a venv made from
  # another venv's python would share nothing with it anyway.
  base="$("$py" -c 'import sys; print(sys._base_executable)')"
  "$base" -m venv "$tools"
  "$tools/bin/python" -m pip install -q --upgrade pip >&2
  "$tools/bin/python" -m pip install -q -r scripts/release-requirements.txt >&2
  zig="$("$tools/bin/python" -c 'import ziglang, os; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))')"
  # CMake takes one executable per tool: small wrappers fix the target glibc.
  for tool in cc c++; do
    printf '#!/bin/sh\nexec "%s" %s -target x86_64-linux-gnu.%s "$@"\n' "$zig" "$tool" "$glibc" > "$tools/zig-$tool"
  done
  for tool in ar ranlib; do printf '#!/bin/sh\nexec "%s" %s "$@"\n' "$zig" "$tool" > "$tools/zig-$tool"; done
  chmod +x "$tools"/zig-*
  echo "$tools_stamp" > "$tools/.stamp"
fi

# Everything that goes into the artifacts, and how they are built.
hash="$(
  { git ls-files -co --exclude-standard csrc jax_mosaic_ffi | grep -v '\.so$'
    echo CMakeLists.txt; echo pyproject.toml; echo README.md; echo LICENSE; echo CHANGELOG.md
    echo scripts/build_wheel.sh; echo scripts/release-requirements.txt; } | LC_ALL=C sort -u | xargs sha256sum |
  sha256sum | cut -c1-16)"
out="build/release/$hash"
if ! compgen -G "$out/dist/jax_mosaic_ffi-*-$plat.whl" >/dev/null; then
  rm -rf build/release  # artifacts of older sources
  mkdir -p "$out"
  echo "== building the sdist and the wheel into $out (zig c++, glibc $glibc; a few minutes)" >&2
  # The wheel is built from the sdist, so a file missing from the sdist fails here.
  CC="$tools/zig-cc" CXX="$tools/zig-c++" \
    CMAKE_ARGS="-DCMAKE_AR=$tools/zig-ar -DCMAKE_RANLIB=$tools/zig-ranlib" \
    "$tools/bin/python" -m build --outdir "$out/raw" . > "$out/build.log" 2>&1 ||
    { tail -40 "$out/build.log" >&2; echo "error: the build failed; log: $out/build.log" >&2; exit 1; }
  PATH="$tools/bin:$PATH" "$tools/bin/auditwheel" repair --plat "$plat" --only-plat --exclude libcuda.so.1 -w "$out/dist" \
    "$out"/raw/*.whl > "$out/repair.log" 2>&1 || { cat "$out/repair.log" >&2; exit 1; }
  cp "$out"/raw/*.tar.gz "$out/dist/"
fi
sdist="$(ls "$out"/dist/jax_mosaic_ffi-*.tar.gz)"
wheel="$(ls "$out"/dist/jax_mosaic_ffi-*-$plat.whl)"

# The verdicts, checked: auditwheel's on the platform tag (the extension's libraries and symbol
# versions), abi3audit's on the stable ABI (it calls only CPython 3.12's limited API).
show="$("$tools/bin/auditwheel" show "$wheel" 2>&1)"
consistent="$(tr '\n' ' ' <<<"$show" | sed -n 's/.*consistent with the following platform tag: *"manylinux_2_\([0-9]*\)_x86_64".*/\1/p')"
if [ -z "$consistent" ] || [ "$consistent" -gt "${glibc#2.}" ] || [[ "$wheel" != *-cp312-abi3-$plat.whl ]]; then
  echo "$show" >&2
  echo "error: $wheel is not a cp312-abi3-$plat wheel" >&2
  exit 1
fi
if ! abi3="$("$tools/bin/abi3audit" --strict --summary "$wheel" 2>&1)" ||
   ! grep -q "0 ABI version mismatches and 0 ABI violations" <<<"$(tr '\n' ' ' <<<"$abi3" | tr -s ' ')"; then
  echo "$abi3" >&2
  echo "error: abi3audit finds the extension of $wheel outside CPython 3.12's limited API" >&2
  exit 1
fi

mkdir -p dist
rm -f dist/jax_mosaic_ffi-*
cp "$sdist" "$wheel" dist/
size() { du -k "$1" | cut -f1; }
tag="$(basename "$wheel" .whl)"; tag="${tag#jax_mosaic_ffi-*-}"
echo "sdist  dist/$(basename "$sdist")  $(size "$sdist") KiB"
echo "wheel  dist/$(basename "$wheel")  $(size "$wheel") KiB  tag $tag"
# auditwheel names the oldest platform the extension's symbols allow and adds that an older tag "would need to
# recompile": not a failure (the tag stays the glibc we build for, --only-plat), so it is said plainly here and
# the full report kept beside the build.
echo "$show" > "$out/auditwheel-show.txt"
echo "auditwheel: tagged $plat; the extension would run on glibc 2.$consistent (manylinux_2_${consistent}) and" \
     "newer (auditwheel show's full report: $out/auditwheel-show.txt)"
echo "abi3audit: $(tr '\n' ' ' <<<"$abi3" | sed 's/.*💁 *//; s/  */ /g')"
echo "$repo/dist/$(basename "$wheel")"
