#!/usr/bin/env bash
# Sets everything up from nothing and runs the tests. GPU tests skip without a GPU.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/setup_env.sh" test
cd "$repo"
# The console script, not `python -m pytest`: that would put the source tree
# (which has no compiled extension) ahead of the installed package.
exec "$repo/.venv/bin/pytest" "$@"
