#!/usr/bin/env bash
# One call on the GPU machine: build and install, run the tests (GPU ones
# included), then the benchmarks. Logs go to $OUT when it is set.
#   bash scripts/gpu_check.sh [tests|bench|all] [pytest args or test files...]
#   bash scripts/gpu_check.sh wheel [pytest args or test files...]
# wheel: nothing is built. The release wheel (JMF_WHEEL, else the one in dist/
# that scripts/build_wheel.sh left there, copied along with the checkout) is
# installed with --no-deps into a venv of its own on top of python3's packages,
# and the tests run from that installed copy: conftest.py refuses to run if
# they would import this checkout's package instead (JMF_EXPECT_INSTALLED_UNDER).
# JMF_BENCH_ONLY=triton_native (python -m benchmarks --only's syntax) runs some benchmarks only.
# The tests run through the README's test command (scripts/test.sh) in its
# offline mode: that machine has no network, and its python3 already has jax
# with the CUDA plugin, nanobind, scikit-build-core and pytest. The venv sees
# those packages; only this package is built, with the benchmarks' baseline
# targets (-DJMF_BENCHMARK_TARGETS=ON) that the bench mode needs.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
what="${1:-all}"; shift || true
out="${OUT:-$repo/build/gpu-logs}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export JMF_PYTHON="${JMF_PYTHON:-python3}" JMF_SYSTEM_SITE_PACKAGES=1 JMF_CUDA=1
export JMF_VENV="${JMF_VENV:-$repo/build/venv-gpu}"
export JMF_CMAKE_DEFINES="${JMF_CMAKE_DEFINES:-JMF_BENCHMARK_TARGETS=ON}"
cd "$repo"
if [ "$what" = wheel ]; then
  if [ -z "${JMF_WHEEL:-}" ]; then
    wheels=(dist/jax_mosaic_ffi-*-manylinux_*.whl)
    if [ "${#wheels[@]}" != 1 ] || [ ! -f "${wheels[0]}" ]; then
      echo "error: wheel mode needs one wheel in dist/ (bash scripts/build_wheel.sh) or JMF_WHEEL; found: ${wheels[*]}" >&2
      exit 1
    fi
    JMF_WHEEL="$repo/${wheels[0]}"
  fi
  export JMF_WHEEL JMF_VENV="$repo/build/venv-gpu-wheel" JMF_CMAKE_DEFINES=
  export JMF_EXPECT_INSTALLED_UNDER="$JMF_VENV"
  echo "== wheel: $(basename "$JMF_WHEEL") $(sha256sum "$JMF_WHEEL" | cut -c1-16)" | tee "$out/wheel.txt"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "== build (wheel mode: install)"
start=$(date +%s)
bash -c 'source scripts/setup_env.sh test,triton' > "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
grep '^!!!' "$out/build.log"  # a venv whose jax cannot see the GPU says so here
echo "built in $(( $(date +%s) - start )) s"
status=0
if [ "$what" = tests ] || [ "$what" = all ] || [ "$what" = wheel ]; then
  echo "== tests"
  # Test files or folders among the arguments replace the default, the whole tests/ folder.
  # Slow tests that need a GPU run (the PDL race's negative control); the other slow
  # ones (the wheel test: build isolation needs the network) do not.
  where=(tests)
  for arg in "$@"; do [ -e "$arg" ] && where=() && break; done
  bash scripts/test.sh -q -rs -p no:cacheprovider -m "not slow or gpu" "$@" "${where[@]}" 2>&1 |
    tee "$out/pytest.log" | tail -60
  status=${PIPESTATUS[0]}
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  echo "== benchmarks"
  "$JMF_VENV/bin/python" -m benchmarks --out "$out" ${JMF_BENCH_ONLY:+--only "$JMF_BENCH_ONLY"} 2>&1 |
    tee "$out/bench.log" | tail -150
fi
exit $status
