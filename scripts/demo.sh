#!/usr/bin/env bash
# Sets everything up from nothing and runs the main demo.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/scripts/setup_env.sh" test
cd "$repo/examples"
exec "$repo/.venv/bin/python" demo.py "$@"
