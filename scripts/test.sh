#!/usr/bin/env bash
# Sets everything up from nothing (or checks that it is up to date) and runs
# the tests. GPU tests skip without a GPU. Arguments go to pytest.
#   -m "not slow"    leaves out the slow tests (the release wheel's build and install, the contract fuzzer)
#   JMF_TEST_JOBS=N  pytest-xdist processes when no test file and no -n is given (default: the CPUs, at most 4;
#                    1: one process)
#   JMF_EXTRAS=test  the extras to install (default test,triton,nvshmem,cute,cutile); with `test` alone every test that
#                    needs Triton, the CuTe DSL, NVSHMEM or torch skips, saying so (a fresh JMF_VENV: extras
#                    already installed there stay)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/setup_env.sh" "${JMF_EXTRAS:-test,triton,nvshmem,cute,cutile}"
cd "$repo"
# The console script of the venv: its editable install maps jax_mosaic_ffi to
# this checkout's Python files plus the extension built into the venv. An
# offline venv (JMF_SYSTEM_SITE_PACKAGES=1) sees pytest without owning its
# script: -P keeps the checkout's folder, which has no extension, off sys.path.
# The whole suite (no test file named, no -n given) runs in parallel, each test file in one process (loadfile:
# a file's module fixtures, the release wheel among them, are made once), where pytest-xdist is installed.
jobs="${JMF_TEST_JOBS:-$(( $(nproc 2>/dev/null || echo 1) < 4 ? $(nproc 2>/dev/null || echo 1) : 4 ))}"
for arg in "$@"; do
  case "$arg" in -n|-n[0-9]*|--numprocesses*|no:xdist) jobs=1 ;; esac
  [ ! -e "${arg%%::*}" ] || jobs=1
done
parallel=()
if [ "$jobs" -gt 1 ] && "$venv/bin/python" -c 'import xdist' 2>/dev/null; then
  parallel=(-n "$jobs" --dist loadfile)
fi
[ -x "$venv/bin/pytest" ] && exec "$venv/bin/pytest" "${parallel[@]}" "$@"
exec "$venv/bin/python" -P -m pytest "${parallel[@]}" "$@"
