#!/usr/bin/env bash
# One call on the GPU machine: build and install, run the tests (GPU ones
# included), then the benchmarks. Logs go to $OUT when it is set.
#   bash scripts/gpu_check.sh [tests|bench|all] [pytest args or test files...]
# Builds with the benchmarks' baseline targets (-DJMF_BENCHMARK_TARGETS=ON).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
what="${1:-all}"; shift || true
out="${OUT:-$repo/build/gpu-logs}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
PY="${JMF_PYTHON:-python3}"
bindir="$(dirname "$(command -v "$PY")")"
cd "$repo"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "== build"
start=$(date +%s)
"$PY" -m pip install --no-build-isolation --no-deps -q --config-settings=cmake.define.JMF_BENCHMARK_TARGETS=ON . \
  > "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
echo "built in $(( $(date +%s) - start )) s"
status=0
if [ "$what" = tests ] || [ "$what" = all ]; then
  echo "== tests"
  # The console script, so the source tree does not shadow the installed package.
  # Not the wheel test: it builds with build isolation, which needs the network.
  # Test files or folders among the arguments replace the default, the whole tests/ folder.
  where=(tests)
  for arg in "$@"; do [ -e "$arg" ] && where=() && break; done
  "$bindir/pytest" -q -rs -p no:cacheprovider -m "not slow" "$@" "${where[@]}" 2>&1 | tee "$out/pytest.log" | tail -60
  status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  echo "== benchmarks"
  "$PY" -m benchmarks --out "$out" 2>&1 | tee "$out/bench.log" | tail -150
fi
exit $status
