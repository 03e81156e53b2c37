# Sourced by scripts/setup_env.sh: a pip install that says what it does while it takes minutes.
#   pip_showing_steps LOG PIP-COMMAND...   runs the pip command with -v, its output whole in LOG and shown as its
#                                          steps: each package it fetches, then CMake and each step of the compile
#                                          ([n/N]); where pip fails, the end of LOG on stderr and pip's status
#   say_requirements REQUIREMENT...        one requirement a line, indented (each holds commas and markers)
pip_showing_steps() {
  local log=$1 status=0
  local -  # pipefail here only: the status is pip's
  set -o pipefail
  shift
  "$@" -v 2>&1 | tee "$log" | sed -nu -E \
    -e 's/^ *Installing build dependencies: started$/   pip: the build'"'"'s own requirements (jax 0.11.2 for its FFI headers, nanobind, scikit-build-core, CMake)/p' \
    -e 's/^ *Collecting ([^ ]+).*/   pip: \1/p' \
    -e 's/^ *\*\*\* Configuring CMake.*/   build: CMake configures the C++ extension/p' \
    -e 's#^ *(\[[0-9]+/[0-9]+\]) Building CXX object .*(csrc/|nanobind/src/)(.*)\.o$#   build: \1 compiling \2\3#p' \
    -e 's#^ *(\[[0-9]+/[0-9]+\]) Linking CXX .* ([^ /]+)$#   build: \1 linking \2#p' \
    -e 's/^ *Installing collected packages: (.{1,90}).*/   pip: installing \1.../p' || status=$?
  if [ "$status" != 0 ]; then
    tail -40 "$log" >&2
    echo "error: pip failed (exit $status); its whole output: $log" >&2
  fi
  return "$status"
}

say_requirements() {
  printf '     %s\n' "$@"
}
