# Sourced by scripts/gpu_check.sh: its benchmarks step.
#   benchmarks_step OUT COMMAND...   runs COMMAND (python -m benchmarks ...) with its output in OUT/bench.log, the
#                                    end of it shown; returns COMMAND's exit status, and where that is not 0 says
#                                    so on stderr, naming the runs the benchmarks report as failed (their
#                                    "failed: ..." line) or, where there is none, the output's last line
benchmarks_step() {
  local out=$1 status failed
  shift
  "$@" 2>&1 | tee "$out/bench.log" | tail -150
  status=${PIPESTATUS[0]}
  [ "$status" != 0 ] || return 0
  failed="$(grep '^failed: ' "$out/bench.log" | tail -1)"
  failed="${failed#failed: }"
  [ -n "$failed" ] || failed="no run reported as failed; the output ends with: $(tail -1 "$out/bench.log")"
  echo "error: the benchmarks failed (exit $status): $failed (all of it in $out/bench.log)" >&2
  return "$status"
}
