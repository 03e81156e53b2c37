# Sourced by every script that needs a Python: the one way they find it. jax >= 0.11 needs 3.12.
#   find_python   prints the first Python >= 3.12 that runs: JMF_PYTHON, then python3.13, python3.12, python3, then
#                 the versions under pyenv's root ($PYENV_ROOT or ~/.pyenv: found even where pyenv's shims point
#                 at an older global version); fails otherwise, saying on stderr what it tried and how to get one.
#                 A JMF_PYTHON that does not run, or is older, is said on stderr and passed over.
find_python() {
  local c said tried=()
  local candidates=(python3.13 python3.12 python3 "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python)
  if [ -n "${JMF_PYTHON:-}" ]; then
    if said="$(_jmf_python_says "$JMF_PYTHON")"; then
      echo "$JMF_PYTHON"; return 0
    fi
    echo "note: JMF_PYTHON=$JMF_PYTHON is not a Python >= 3.12 that runs ($said); looking for one" >&2
    tried+=("JMF_PYTHON=$JMF_PYTHON")
  fi
  for c in "${candidates[@]}"; do
    [[ "$c" != *"*"* ]] || continue  # no pyenv versions: the pattern itself
    tried+=("$c")
    if _jmf_python_says "$c" >/dev/null; then
      echo "$c"; return 0
    fi
  done
  echo "error: no Python >= 3.12 found (tried ${tried[*]}); jax_mosaic_ffi needs one (jax >= 0.11 does)." >&2
  echo "       Install one (pyenv install 3.12, or your system's python3.12 package) or set JMF_PYTHON to its path." >&2
  return 1
}

# Succeeds when "$1" runs and is Python >= 3.12; prints what is wrong otherwise.
_jmf_python_says() {
  local out
  command -v "$1" >/dev/null 2>&1 || [ -x "$1" ] || { echo "not found"; return 1; }
  if ! out="$("$1" -c 'import sys; print("%d.%d" % sys.version_info[:2]); sys.exit(sys.version_info < (3, 12))' 2>&1)"; then
    out="${out%%$'\n'*}"
    [[ "$out" =~ ^3\.[0-9]+$ ]] && echo "Python $out" || echo "${out:-it failed}"
    return 1
  fi
}
