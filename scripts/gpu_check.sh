#!/usr/bin/env bash
# One call on the GPU machine: build and install, run the tests (GPU ones
# included), then the benchmarks. Logs go to $OUT when it is set. It exits non-zero when the tests fail (pytest's
# status) or, after they have written what they measured, the benchmarks do (named at the end).
#   bash scripts/gpu_check.sh [tests|gpu-tests|bench|all|stash] [pytest args or test files...]
#   bash scripts/gpu_check.sh wheel [pytest args or test files...]
# gpu-tests: only the tests marked gpu or multi_gpu (CI runs the CPU ones); the same as JMF_GPU_ONLY=1 tests.
# wheel: nothing is built. The release wheel (JMF_WHEEL, else the one in dist/
# that scripts/build_wheel.sh left there, copied along with the checkout) is
# installed with --no-deps into a venv of its own on top of python3's packages,
# and the tests run from that installed copy: conftest.py refuses to run if
# they would import this checkout's package instead (JMF_EXPECT_INSTALLED_UNDER).
# JMF_BENCH_ONLY=triton_native (python -m benchmarks --only's syntax) runs some benchmarks only, and replaces only
# their sections of docs/benchmarks.md (--splice; the copy in $OUT is the whole page).
#
# In parts (one call holds 10 minutes; the whole suite took about 600 s on the H200, its GPU tests about 290 s):
#   JMF_PART=2/3 bash scripts/gpu_check.sh gpu-tests
# or in parallel on the one GPU: JMF_JOBS=4 bash scripts/gpu_check.sh gpu-tests (pytest-xdist, by test file; the
# tests marked exclusive, which measure the whole GPU's memory or wall time, run alone after the rest).
# runs the second of three parts: whole test files, shared out by scripts/test_parts.py from this tree's
# collection (most tests first, to the part with the fewest), so the parts of one tree cover every selected
# test once. Make the calls back to back: a warm machine keeps the build (build/venv-gpu). In `all` mode the
# benchmarks run with the last part only. Test files given as arguments replace the parts.
#
# Packages the machine lacks (it has jax 0.11.2 and no network; one call carries at most 64 MiB): bundles that
# scripts/carry_pack.sh made here in the ignored .carry/ (NAME.part-NN of at most 59 MiB and NAME.sha256).
# Carry the parts one call each, back to back, each with NAME.sha256: every call of this script, any mode, first
# moves the parts it finds in .carry/ to a stash outside the tree (JMF_CARRY_STASH, /tmp/jmf-carried), since the
# next call replaces the tree's carried folders; `stash` mode does only that. Then
#   JMF_CARRIED="jax12 cute" JMF_PART=1/2 bash scripts/gpu_check.sh gpu-tests
# unpacks those bundles once (all parts there, checksum right, or it says what is missing) and installs them in the
# venv for the tests and the benchmarks (a .pth file ahead of the machine's packages; theirs honoured: carried.sh).
# The extension is built before, against the machine's jaxlib: the oldest supported one, whose FFI headers it must be
# built with (docs/compatibility.md); the script checks that, and prints the jax that runs (versions.txt, and the
# tests' header).
#
# The tests run through the README's test command (scripts/test.sh) in its
# offline mode: that machine has no network, and its python3 already has jax
# with the CUDA plugin, nanobind, scikit-build-core and pytest. The venv sees
# those packages; only this package is built, with the benchmarks' baseline
# targets (-DJMF_BENCHMARK_TARGETS=ON) that the bench mode needs.
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
what="${1:-all}"; shift || true
if [ "$what" = gpu-tests ]; then
  what=tests
  JMF_GPU_ONLY=1
fi
out="${OUT:-$repo/build/gpu-logs}"; mkdir -p "$out"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
export JMF_PYTHON="${JMF_PYTHON:-python3}" JMF_SYSTEM_SITE_PACKAGES=1 JMF_CUDA=1
export JMF_VENV="${JMF_VENV:-$repo/build/venv-gpu}"
export JMF_CMAKE_DEFINES="${JMF_CMAKE_DEFINES:-JMF_BENCHMARK_TARGETS=ON}"
cd "$repo"
stash="${JMF_CARRY_STASH:-/tmp/jmf-carried}"
source scripts/carried.sh
source scripts/benchmarks_step.sh
carried_stash "$repo" "$stash"
[ "$what" != stash ] || { ls -l "$stash" 2>/dev/null; exit 0; }
part="" parts=""
if [ -n "${JMF_PART:-}" ]; then
  if ! [[ "$JMF_PART" =~ ^([0-9]+)/([0-9]+)$ ]] || [ "${BASH_REMATCH[1]}" -lt 1 ] ||
     [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
    echo "error: JMF_PART=$JMF_PART: write K/N with 1 <= K <= N (JMF_PART=2/3: the second of three parts)" >&2
    exit 2
  fi
  part="${BASH_REMATCH[1]}" parts="${BASH_REMATCH[2]}"
fi
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
# The carried bundles first: a machine gone cold between the calls has none, and a build would only delay saying so.
carried=""
if [ -n "${JMF_CARRIED:-}" ]; then
  # shellcheck disable=SC2086  # a list of names
  carried="$(carried_path "$stash" $JMF_CARRIED)" || exit 1
fi
carried_install "$JMF_VENV" || exit 1  # an earlier call's, off the build's path
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "== build (wheel mode: install)"
start=$(date +%s)
# The extras scripts/test.sh asks for: the same install, so the tests find it up to date and build nothing.
# Appended: one call may run this script (and jax_triton_tests.sh) several times; at most 8 files come back.
echo "== build, $(date -u '+%H:%M:%S UTC'): $what $*" >> "$out/build.log"
first=$(($(wc -l < "$out/build.log") + 1))
bash -c 'source scripts/setup_env.sh test,triton,nvshmem,cute,cutile' >> "$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
tail -n +"$first" "$out/build.log" | grep '^!!!'  # a venv whose jax cannot see the GPU says so here
echo "built in $(( $(date +%s) - start )) s"

# The carried packages go on the tests' and the benchmarks' path after the build, which took the machine's jaxlib
# and its FFI headers (a carried jax comes after the venv's own packages, before the machine's).
if [ -n "$carried" ]; then
  read -r built oldest < <("$JMF_VENV/bin/python" -P -c '
from jax_mosaic_ffi.base import versions
from jax_mosaic_ffi.base.native import core
print(core.BUILT_AGAINST["jaxlib"], ".".join(map(str, versions.OLDEST)))')
  if [ -z "$oldest" ] || [ "$built" != "$oldest" ]; then
    echo "error: the extension in $JMF_VENV was built against jaxlib ${built:-other than the installed one}, not" \
         "the oldest supported ${oldest:-(unknown)} (versions.OLDEST), whose FFI headers every jax in the range accepts:" \
         "remove $JMF_VENV and run again" >&2
    exit 1
  fi
  carried_install "$JMF_VENV" "$carried" || exit 1
  tools="$(carried_tools "$stash" "$carried")"
  [ -z "$tools" ] || export PATH="$tools:$PATH"
fi
"$JMF_VENV/bin/python" -P -c '
import jax, jaxlib
from jax_mosaic_ffi.base.native import core
print(f"== jax {jax.__version__} and jaxlib {jaxlib.__version__} from {jax.__file__.rsplit("/", 2)[0]}; "
      f"extension built against jaxlib {core.BUILT_AGAINST["jaxlib"]}")' | tee "$out/versions.txt"
# cuTile (installed or carried): the tileiras it runs, which it takes from the nvidia/cu13/bin its pip packages put
# first on the path when nvidia-cuda-tileiras, -nvcc and -nvvm share a release (else the system's, if any).
"$JMF_VENV/bin/python" -P -c '
import importlib.util
if importlib.util.find_spec("cuda") is not None and importlib.util.find_spec("cuda.tile") is not None:
  from jax_mosaic_ffi.cutile.compiler import release
  try:
    ct = release.require_cutile()
    from cuda.tile import _compile
    print(f"== cuTile {release.release()} from {ct.__file__.rsplit("/", 3)[0]}; tileiras "
          f"{_compile._find_compiler_bin().path}: {release.tileiras_identity()}")
  except Exception as e:
    print(f"== cuTile cannot compile here: {type(e).__name__}: {e}")' 2>&1 | tee -a "$out/versions.txt"

status=0
if [ "$what" = tests ] || [ "$what" = all ] || [ "$what" = wheel ]; then
  # Slow tests that need a GPU run (the PDL race's negative control); the other slow
  # ones (the wheel test: build isolation needs the network) do not.
  marks="not slow or gpu"
  [ -z "${JMF_GPU_ONLY:-}" ] || marks="gpu or multi_gpu"
  # Test files or folders among the arguments replace the default, the whole tests/ folder (or its part).
  where=(tests)
  for arg in "$@"; do [ -e "$arg" ] && where=() && part="" && break; done
  log="$out/pytest.log"
  if [ -n "$part" ]; then
    log="$out/pytest-part$part-of-$parts.log"
    # A file that fails to import must fail the run, not drop out of every part.
    collected="$out/collect-part$part-of-$parts.txt"
    bash scripts/test.sh -q --collect-only -p no:cacheprovider -m "$marks" tests > "$collected" 2>&1
    collect_status=$?
    if [ "$collect_status" != 0 ] && [ "$collect_status" != 5 ]; then
      echo "error: collecting the tests failed (exit $collect_status); the end of $collected:" >&2
      tail -30 "$collected" >&2
      exit "$collect_status"
    fi
    mapfile -t where < <("$JMF_VENV/bin/python" scripts/test_parts.py "$part" "$parts" < "$collected")
    echo "== tests, part $part of $parts (-m \"$marks\"): ${where[*]:-no file}" | tee "$out/part.txt"
  else
    echo "== tests (-m \"$marks\")"
  fi
  if [ "${#where[@]}" -gt 0 ] || [ -z "$part" ]; then
    if [ "${JMF_JOBS:-1}" -gt 1 ]; then
      # Test files share the one GPU among JMF_JOBS processes (pytest-xdist; JAX takes memory as it needs it,
      # not 75% up front); the tests that measure the whole GPU or wall time run alone afterwards.
      XLA_PYTHON_CLIENT_PREALLOCATE=false bash scripts/test.sh -q -rs -p no:cacheprovider -n "$JMF_JOBS" \
        --dist loadfile -m "($marks) and not exclusive" "$@" "${where[@]}" 2>&1 | tee "$log" | tail -60
      status=${PIPESTATUS[0]}
      echo "== the tests that run alone (-m exclusive)" | tee -a "$log"
      bash scripts/test.sh -q -rs -p no:cacheprovider -m "($marks) and exclusive" "$@" "${where[@]}" 2>&1 |
        tee -a "$log" | tail -20
      # pytest's 5: nothing selected (a part without such tests)
      alone=${PIPESTATUS[0]}; [ "$alone" = 0 ] || [ "$alone" = 5 ] || status=$alone
    else
      bash scripts/test.sh -q -rs -p no:cacheprovider -m "$marks" "$@" "${where[@]}" 2>&1 | tee "$log" | tail -60
      status=${PIPESTATUS[0]}
    fi
  fi
fi
if [ "$what" = bench ] || { [ "$what" = all ] && [ "$part" = "$parts" ]; }; then
  echo "== benchmarks"
  # A run of some benchmarks replaces only their sections of the page (--splice): $out gets the whole page.
  # Its failure fails the script, after the benchmarks have written what they measured (a failed test run's
  # status wins: it is the first thing to fix).
  benchmarks_step "$out" "$JMF_VENV/bin/python" -m benchmarks --out "$out" \
    ${JMF_BENCH_ONLY:+--only "$JMF_BENCH_ONLY" --splice}
  bench_status=$?
  [ "$bench_status" = 0 ] || [ "$status" != 0 ] || status=$bench_status
fi
exit $status
