#!/usr/bin/env bash
# The long fuzz run of the contract (docs/fuzzing.md): libFuzzer where clang
# has it, else the g++ driver's own loop. Both under ASAN and UBSAN.
#   bash scripts/fuzz.sh [seconds]      (default 600; FUZZ_SEED=S fixes the g++ loop's seed)
# Builds into build/fuzz/; failing inputs land in build/fuzz/artifacts/.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-600}"
out="$repo/build/fuzz"
mkdir -p "$out/corpus" "$out/artifacts"
sources=("$repo/tests/fuzz/contract_fuzz.cc" "$repo/csrc/contract/contract.cc" "$repo/csrc/contract/tensor_maps.cc" "$repo/csrc/contract/launch_programs.cc"
         "$repo/csrc/contract/module_format.cc" "$repo/csrc/contract/cute_object.cc"
         "$repo/csrc/driver/zlib_inflate.cc")
flags=(-std=c++20 -O1 -g -fno-sanitize-recover=all -fno-omit-frame-pointer -D_GLIBCXX_ASSERTIONS -I"$repo/csrc")

# The first clang that links a libFuzzer target (Debian installs clang++-NN).
clang=""
for candidate in ${CLANGXX:-} clang++ clang++-{21..14}; do
  if command -v "$candidate" >/dev/null &&
     echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' |
       "$candidate" -x c++ -fsanitize=fuzzer - -o "$out/probe" 2>/dev/null; then
    clang="$candidate"
    break
  fi
done

if [[ -n "$clang" ]]; then
  echo "fuzz.sh: libFuzzer ($clang), $seconds s" >&2
  "$clang" "${flags[@]}" -fsanitize=fuzzer,address,undefined -DJMF_LIBFUZZER "${sources[@]}" -ldl \
    -o "$out/contract_fuzz_libfuzzer"
  # New inputs go to build/fuzz/corpus; the committed ones are read as seeds.
  # -max_len: the driver grows long strings and arrays from a few bytes.
  exec "$out/contract_fuzz_libfuzzer" -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/" "$out/corpus" "$repo/tests/fuzz/corpus"
fi

echo "fuzz.sh: no clang with libFuzzer; the g++ driver's own loop, $seconds s" >&2
g++ "${flags[@]}" -fsanitize=address,undefined "${sources[@]}" -ldl -o "$out/contract_fuzz"
"$out/contract_fuzz" "$repo/tests/fuzz/corpus"
exec "$out/contract_fuzz" --seconds "$seconds" --artifacts "$out/artifacts" ${FUZZ_SEED:+--seed "$FUZZ_SEED"}
