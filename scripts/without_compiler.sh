#!/usr/bin/env bash
# Runs a command as on a user's machine without a compiler, and fails if
# anything in it tried to compile: CI installs the wheel and runs the tests
# this way, proving that installing and using the wheel builds nothing.
#   bash scripts/without_compiler.sh COMMAND [ARGS...]
# PATH becomes one folder of links to the tools of the current PATH less every
# C/C++ compiler (gcc, g++, cc, c++, clang, their versioned and triplet names),
# plus stubs under the common names that record the call and fail: CMake and
# pip look compilers up on PATH first, so a build attempt meets a stub instead
# of falling back to /usr/bin. CC, CXX and CUDAHOSTCXX are unset; JMF_WITHOUT_COMPILER=1 tells the tests
# that compare with nvcc (which needs a host compiler) to skip.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="$repo/build/no-compiler/bin"
log="$repo/build/no-compiler/calls.log"
compiler='^((.*-)?(gcc|g\+\+|cc|c\+\+|cpp|clang|clang\+\+|clang-cpp|c89|c99|tcc|icx|icpx|nvcc|zig)(-[0-9.]+)?)$'
rm -rf "$bin"; mkdir -p "$bin"; : > "$log"
IFS=: read -ra dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
  [ -d "$dir" ] || continue
  for tool in "$dir"/*; do
    name="${tool##*/}"
    [ -x "$tool" ] && [ ! -d "$tool" ] && [ ! -e "$bin/$name" ] || continue
    [[ "$name" =~ $compiler ]] && continue
    ln -s "$tool" "$bin/$name"
  done
done
for name in cc c++ gcc g++ clang clang++ cpp; do
  printf '#!/bin/sh\necho "%s $*" >> "%s"\necho "without_compiler.sh: %s was called: this step must not compile" >&2\nexit 1\n' \
    "$name" "$log" "$name" > "$bin/$name"
  chmod +x "$bin/$name"
done
status=0
env -u CC -u CXX -u CUDAHOSTCXX JMF_WITHOUT_COMPILER=1 PATH="$bin" "$@" || status=$?
if [ -s "$log" ]; then
  echo "error: a compiler was called (no compiler is on a user's PATH):" >&2
  sed 's/^/  /' "$log" >&2
  exit 1
fi
exit $status
