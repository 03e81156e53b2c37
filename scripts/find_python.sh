# Sourced: find_python prints the first Python >= 3.12 it finds (JMF_PYTHON first, then the usual names and
# the versions under pyenv's root, $PYENV_ROOT or ~/.pyenv), or fails. jax >= 0.11 needs 3.12.
find_python() {
  local candidates=("${JMF_PYTHON:-}" python3.13 python3.12 python3)
  candidates+=("${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python)
  for c in "${candidates[@]}"; do
    [ -n "$c" ] || continue
    command -v "$c" >/dev/null 2>&1 || [ -x "$c" ] || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  return 1
}
