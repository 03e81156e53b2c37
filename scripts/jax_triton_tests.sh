#!/usr/bin/env bash
# jax-triton's own test files against jax_mosaic_ffi on the GPU machine (scripts/jax_triton_tests.py says how):
#   JMF_CARRIED="triton39" bash scripts/jax_triton_tests.sh PATH/gluon_test.py [more files] [-- pytest args]
# builds and installs the package as scripts/gpu_check.sh does (offline, into its venv, which a warm machine keeps),
# moves carried bundle parts out of the tree and unpacks the bundles JMF_CARRIED names (scripts/carried.sh), installs
# them in the venv (behind the jax_triton alias, first on sys.path), and runs the files; the log goes to
# $OUT/jax_triton_tests.log.
# The test files are jax-triton's, not ours: carry them in an ignored folder (.carry/jax-triton-tests/, one call).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
out="${OUT:-$repo/build/gpu-logs}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export JMF_PYTHON="${JMF_PYTHON:-python3}" JMF_SYSTEM_SITE_PACKAGES=1 JMF_CUDA=1
export JMF_VENV="${JMF_VENV:-$repo/build/venv-gpu}"
export JMF_CMAKE_DEFINES="${JMF_CMAKE_DEFINES:-JMF_BENCHMARK_TARGETS=ON}"  # the build gpu_check.sh makes
cd "$repo"
stash="${JMF_CARRY_STASH:-/tmp/jmf-carried}"
source scripts/carried.sh
carried_stash "$repo" "$stash"
carried=""
if [ -n "${JMF_CARRIED:-}" ]; then  # before the build: a machine gone cold has no bundle, and should say so at once
  # shellcheck disable=SC2086  # a list of names
  carried="$(carried_path "$stash" $JMF_CARRIED)" || exit 1
fi
carried_install "$JMF_VENV" || exit 1  # an earlier call's, off the build's path
echo "== build, $(date -u '+%H:%M:%S UTC'): jax-triton's tests" >> "$out/build.log"  # appended, as gpu_check.sh does
bash -c 'source scripts/setup_env.sh test,triton,nvshmem,cute' >> "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
carried_install "$JMF_VENV" "$carried" || exit 1
"$JMF_VENV/bin/python" -P -c '
import jax, triton
print(f"== jax {jax.__version__}, triton {triton.__version__} from {triton.__file__.rsplit("/", 2)[0]}")' |
  tee "$out/jax_triton_tests.log"
"$JMF_VENV/bin/python" -P scripts/jax_triton_tests.py "$@" \
  2>&1 | tee -a "$out/jax_triton_tests.log" | tail -80
exit "${PIPESTATUS[0]}"
