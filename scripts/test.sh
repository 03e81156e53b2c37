#!/usr/bin/env bash
# Sets everything up from nothing (or checks that it is up to date) and runs
# the tests. GPU tests skip without a GPU. Arguments go to pytest.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/setup_env.sh" test,triton,nvshmem,cute
cd "$repo"
# The console script of the venv: its editable install maps jax_mosaic_ffi to
# this checkout's Python files plus the extension built into the venv. An
# offline venv (JMF_SYSTEM_SITE_PACKAGES=1) sees pytest without owning its
# script: -P keeps the checkout's folder, which has no extension, off sys.path.
# JMF_TEST_PYTHONPATH goes first on the tests' path only, never the build's (scripts/gpu_check.sh's carried jax).
[ -z "${JMF_TEST_PYTHONPATH:-}" ] || export PYTHONPATH="$JMF_TEST_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}"
[ -x "$venv/bin/pytest" ] && exec "$venv/bin/pytest" "$@"
exec "$venv/bin/python" -P -m pytest "$@"
