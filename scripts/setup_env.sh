#!/usr/bin/env bash
# Sourced by demo.sh and test.sh: makes a venv (Python >= 3.12) and installs
# jax_mosaic_ffi into it, editable, with the given extras (none for the demo).
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
#   JMF_TRITON  pin triton (the `triton` extra) to this version (default: the newest pip finds in range)
#   JMF_WHEEL   install this wheel instead (not editable, nothing built; CI's second venv, and with
#               JMF_SYSTEM_SITE_PACKAGES=1 the H200's: scripts/gpu_check.sh wheel)
#   JMF_CUDA    auto (default): add the `cuda` extra (jax[cuda13]) where an NVIDIA driver is found
#               (jax_mosaic_ffi/base/driver_probe.py); 1 always, 0 never
#   JMF_SYSTEM_SITE_PACKAGES=1  offline: the venv sees JMF_PYTHON's packages (jax, its CUDA plugin,
#               nanobind, scikit-build-core, pytest...) and only this package is built, with
#               --no-build-isolation --no-deps: nothing is downloaded (the GPU machine has no network)
#   JMF_CMAKE_DEFINES  space-separated NAME=VALUE CMake definitions for the build, e.g.
#               JMF_BENCHMARK_TARGETS=ON (the benchmarks' baseline targets)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
extras="${1:-}"

source "$repo/scripts/find_python.sh"

# Everything the compiled extension and the installed metadata come from.
build_stamp() {
  (
    cd "$repo"
    { find csrc -type f; echo CMakeLists.txt; echo pyproject.toml; } | LC_ALL=C sort | xargs sha256sum
    echo "jax=${JMF_JAX:-} triton=${JMF_TRITON:-} wheel=${JMF_WHEEL:-} checkout=$repo"
    [ -z "${JMF_WHEEL:-}" ] || sha256sum "$JMF_WHEEL"  # a new build under the same name
    echo "offline=${JMF_SYSTEM_SITE_PACKAGES:-} defines=${JMF_CMAKE_DEFINES:-}"
  ) | sha256sum | cut -d' ' -f1
}

loud() {  # a warning nobody scrolls past
  {
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    for line in "$@"; do echo "!!! $line"; done
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
  } >&2
}

venv="${JMF_VENV:-$repo/.venv}"
offline="${JMF_SYSTEM_SITE_PACKAGES:-0}"
[ "$offline" = 0 ] || offline=1

# A machine with an NVIDIA driver gets jax's CUDA plugin: without it jax runs on
# the CPU there and every GPU test would skip.
cuda_wanted=0
case "${JMF_CUDA:-auto}" in
  0|no|off) ;;
  1|yes|on) cuda_wanted=1 ;;
  *)
    probe_py="$venv/bin/python"
    [ -x "$probe_py" ] || probe_py="$(find_python 2>/dev/null || command -v python3 || true)"
    if [ -n "$probe_py" ] && signs="$("$probe_py" "$repo/jax_mosaic_ffi/base/driver_probe.py" 2>/dev/null)"; then
      cuda_wanted=1
      echo "== NVIDIA driver found ($signs): jax's CUDA plugin is wanted"
    fi ;;
esac
[ "$cuda_wanted" = 0 ] || extras="${extras:+$extras,}cuda"
# Each venv builds in a folder of its own, kept for the next (incremental) build: two installs of one checkout into
# two venvs at once never share one (the checkout's build/ was shared, and one install broke the other's).
defines=("--config-settings=build-dir=$venv/build/{wheel_tag}")
for define in ${JMF_CMAKE_DEFINES:-}; do defines+=("--config-settings=cmake.define.$define"); done
# Two runs into one venv (two terminals, the tests and the docs) take turns to check and install; the lock is let
# go once the venv is ready, so their tests run side by side.
# A fresh venv's Python first, so that where there is none nothing is made (find_python says what it tried).
if [ ! -x "$venv/bin/python" ]; then PY="$(find_python)" || exit 1; fi
mkdir -p "$venv"
exec {install_lock}>"$venv/.jax_mosaic_ffi-install.lock"
command -v flock >/dev/null 2>&1 && flock "$install_lock"
stamp_file="$venv/.jax_mosaic_ffi-install-stamp"
stamp="$(build_stamp)"
# The extras installed so far (the file, empty where none): the demo (none) and the tests (test,triton,...)
# share a venv, so a run asking for fewer extras than are there installs nothing.
extras_file="$venv/.jax_mosaic_ffi-install-extras"
# pip's whole output, for when it fails.
install_log="$venv/.jax_mosaic_ffi-install.log"
source "$repo/scripts/pip_steps.sh"
installed_extras="$(cat "$extras_file" 2>/dev/null || true)"
extras_union="$(echo "$installed_extras,$extras" | tr ',' '\n' | sed '/^$/d' | LC_ALL=C sort -u | paste -sd, -)"
# Up to date but for some extras (the docs after the tests, the tests after the demo): install what those extras
# need, as pyproject.toml lists them, and build nothing. Offline nothing can be downloaded: the full path below.
# The versions asked for (JMF_JAX, JMF_TRITON), pinned in every install below.
pins=()
[ -z "${JMF_JAX:-}" ] || pins=("jax==$JMF_JAX" "jaxlib==$JMF_JAX")
[ -z "${JMF_TRITON:-}" ] || pins+=("triton==$JMF_TRITON")
if [ "$offline" = 0 ] && [ -x "$venv/bin/python" ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] &&
   [ -f "$extras_file" ] && [ "$extras_union" != "$installed_extras" ]; then
  missing_extras="$(comm -13 <(echo "$installed_extras" | tr ',' '\n' | LC_ALL=C sort) \
                             <(echo "$extras_union" | tr ',' '\n' | LC_ALL=C sort) | paste -sd, -)"
  mapfile -t requirements < <("$venv/bin/python" -c '
import sys, tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
print("\n".join(r for extra in sys.argv[2].split(",") for r in extras[extra]))' "$repo/pyproject.toml" "$missing_extras")
  echo "== jax_mosaic_ffi is up to date in $venv, but this script needs the extras [$missing_extras], which the"
  echo "   earlier install (extras [$installed_extras]) left out; installing them (nothing is rebuilt):"
  say_requirements "${requirements[@]}"
  if pip_showing_steps "$install_log" "$venv/bin/python" -m pip install "${requirements[@]}" "${pins[@]}"; then
    echo "$extras_union" > "$extras_file"
    installed_extras="$extras_union"
  fi
fi
if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp_file" 2>/dev/null)" = "$stamp" ] &&
   [ "$extras_union" = "$installed_extras" ] &&
   compgen -G "$venv/lib/python3*/site-packages/jax_mosaic_ffi/base/_core*.so" >/dev/null; then
  echo "== jax_mosaic_ffi is up to date in $venv (no change in csrc/, CMakeLists.txt or pyproject.toml)"
else
  if [ ! -x "$venv/bin/python" ]; then
    [ -n "${PY:-}" ] || { PY="$(find_python)" || exit 1; }  # another run made the venv, then failed
    if [ "$offline" = 1 ]; then
      echo "== creating $venv with $PY ($("$PY" --version)), seeing its packages (offline)"
      "$PY" -m venv --system-site-packages "$venv"
      # --system-site-packages reaches the base interpreter's packages only; when
      # $PY is itself a venv its own site-packages come through this .pth.
      site_dir="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
      "$PY" -c 'import site; print("\n".join(site.getsitepackages()))' > "$site_dir/_jmf_parent_site.pth"
    else
      echo "== creating $venv with $PY ($("$PY" --version))"
      "$PY" -m venv "$venv"
      "$venv/bin/python" -m pip install -q --upgrade pip
    fi
  elif [ "$offline" = 1 ] && ! grep -qi "include-system-site-packages *= *true" "$venv/pyvenv.cfg"; then
    echo "error: JMF_SYSTEM_SITE_PACKAGES=1, but $venv was made without them: remove it or set JMF_VENV." >&2
    exit 1
  fi
  rm -f "$stamp_file"
  extras="$extras_union"
  if [ "$offline" = 1 ] && [ -n "${JMF_WHEEL:-}" ]; then
    # Nothing can be downloaded, nothing is built: the wheel alone, its dependencies already there.
    needed="import jax, jaxlib, numpy, ml_dtypes, pytest"
    if ! missing="$("$venv/bin/python" -c "$needed" 2>&1)"; then
      echo "error: JMF_SYSTEM_SITE_PACKAGES=1 installs nothing but the wheel, and $venv cannot" >&2
      echo "       import what it needs ($needed): ${missing##*$'\n'}" >&2
      exit 1
    fi
    echo "== installing $(basename "$JMF_WHEEL") into $venv (offline: --no-index --no-deps, nothing built)"
    "$venv/bin/python" -m pip install -q --no-index --no-deps --force-reinstall "$JMF_WHEEL"
    # The dependencies are the system's: say which of the wheel's requirements they miss.
    unmet="$("$venv/bin/python" -m pip check 2>&1 | grep -i '^jax.mosaic.ffi ' || true)"
    [ -z "$unmet" ] || loud "$venv does not meet all of the wheel's requirements (tests run anyway):" "$unmet"
  elif [ "$offline" = 1 ]; then
    # Nothing can be downloaded: every dependency must already be importable.
    needed="import jax, jaxlib, numpy, ml_dtypes, nanobind, scikit_build_core, pytest"
    if ! missing="$("$venv/bin/python" -c "$needed" 2>&1)"; then
      echo "error: JMF_SYSTEM_SITE_PACKAGES=1 installs nothing but this package, and $venv cannot" >&2
      echo "       import what it needs ($needed): ${missing##*$'\n'}" >&2
      exit 1
    fi
    echo "== installing jax_mosaic_ffi into $venv (editable, offline: --no-build-isolation --no-deps)"
    "$venv/bin/python" -m pip install -q --no-build-isolation --no-deps "${defines[@]}" -e "$repo"
  elif [ -n "${JMF_WHEEL:-}" ]; then
    echo "== installing $(basename "$JMF_WHEEL")${extras:+[$extras]}${pins:+ ${pins[*]}} into $venv"
    "$venv/bin/python" -m pip install -q "$JMF_WHEEL${extras:+[$extras]}" "${pins[@]}"
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
    echo "== installing jax_mosaic_ffi${extras:+[$extras]}${pins:+ ${pins[*]}} into $venv, editable: pip fetches the"
    echo "   packages, then compiles the C++ extension (about 2 minutes on 2 cores; each step is shown below)"
    if ! pip_showing_steps "$install_log" "$venv/bin/python" -m pip install "${defines[@]}" -e "$repo${extras:+[$extras]}" "${pins[@]}"; then
      [ "$cuda_wanted" = 1 ] || exit 1
      loud "An NVIDIA driver is here but jax_mosaic_ffi[cuda] (jax[cuda13]) could not be installed" \
           "(no network?). Installing without it: jax will run on the CPU and GPU TESTS WILL SKIP." \
           "Offline, with jax's CUDA plugin already in a Python: JMF_SYSTEM_SITE_PACKAGES=1 JMF_PYTHON=that-python"
      extras="$(echo "$extras" | tr ',' '\n' | grep -vx cuda | paste -sd, -)"
      pip_showing_steps "$install_log" "$venv/bin/python" -m pip install "${defines[@]}" -e "$repo${extras:+[$extras]}" "${pins[@]}"
    fi
  fi
  echo "$stamp" > "$stamp_file"
  echo "$extras" > "$extras_file"
fi
exec {install_lock}>&-  # the lock, let go
if [ "$cuda_wanted" = 1 ] &&
   ! jax_said="$("$venv/bin/python" -c 'import jax; print(jax.devices("cuda")[0].device_kind)' 2>&1)"; then
  loud "An NVIDIA driver is here but jax in $venv has no CUDA backend: GPU tests will skip and" \
       "kernels will not run. jax said: ${jax_said##*$'\n'}" \
       "Fix: install jax_mosaic_ffi[cuda] (jax[cuda13]) into it, or offline JMF_SYSTEM_SITE_PACKAGES=1" \
       "with JMF_PYTHON pointing at a Python that has jax's CUDA plugin."
fi
export PATH="$venv/bin:$PATH"
