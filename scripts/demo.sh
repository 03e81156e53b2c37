#!/usr/bin/env bash
# Sets everything up from nothing (or checks that it is up to date) and runs
# the main demo.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/setup_env.sh"  # no extras: the demo needs the package alone
cd "$repo/examples"
exec "$venv/bin/python" demo.py "$@"
