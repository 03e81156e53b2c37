"""The contract fuzzer (tests/fuzz/contract_fuzz.cc), briefly, under ASAN and UBSAN.

It builds the driver with g++ from csrc/contract/ and csrc/driver/zlib_inflate.cc
alone: no jaxlib, CUDA or the package's own build. docs/fuzzing.md has the
long run. JMF_FUZZ_SECONDS lengthens this one; JMF_FUZZ_SEED replays a seed.
"""

import os
import re
import shutil
import subprocess

import pytest

import fresh_process

# Nothing here depends on jax: CI's second pass, with the oldest supported
# jax, leaves it out.
pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# _GLIBCXX_ASSERTIONS: an index past size() but inside the allocation (spare
# capacity, the next member) is invisible to ASAN.
FLAGS = ["-std=c++20", "-O1", "-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
         "-fno-omit-frame-pointer", "-D_GLIBCXX_ASSERTIONS"]
SOURCES = ["tests/fuzz/contract_fuzz.cc", "csrc/contract/contract.cc", "csrc/contract/tensor_maps.cc",
           "csrc/contract/launch_programs.cc",
           "csrc/contract/module_format.cc", "csrc/contract/cute_object.cc",
           "csrc/driver/zlib_inflate.cc"]
CORPUS = os.path.join(ROOT, "tests", "fuzz", "corpus")
SECONDS = float(os.environ.get("JMF_FUZZ_SECONDS", "10"))
# Far below what a slow 2-core machine runs in SECONDS (tens of thousands of
# cases per target here): enough that every invariant check has run.
MIN_CASES, MIN_ACCEPTED = 1000, 100


def _tail(text: str, n: int = 4000) -> str:
  return text if len(text) <= n else "..." + text[-n:]


def _sanitizer_env(cxx: str, work) -> dict:
  """An environment in which this compiler's ASAN/UBSAN binaries run; skips if there is none."""
  probe_source = work / "probe.cc"
  probe_source.write_text("#include <vector>\nint main() { std::vector<int> v(4); return v[3]; }\n")
  probe = work / "probe"
  built = subprocess.run([cxx, *FLAGS, str(probe_source), "-o", str(probe)], capture_output=True, text=True)
  if built.returncode != 0:
    pytest.skip(f"{cxx} cannot build with -fsanitize=address,undefined (runtime libraries missing?): "
                f"{_tail(built.stderr, 500)}")
  env = dict(os.environ)
  # LeakSanitizer needs ptrace, which some CI containers forbid; nothing in
  # the contract code allocates by hand, so it is the one part worth dropping.
  for asan_options in (os.environ.get("ASAN_OPTIONS", ""), "detect_leaks=0"):
    env["ASAN_OPTIONS"] = asan_options
    ran = subprocess.run([str(probe)], capture_output=True, text=True, env=env, timeout=fresh_process.HANG_GUARD_S)
    if ran.returncode == 0:
      return env
  pytest.skip(f"binaries built with {cxx} -fsanitize=address,undefined do not run here: {_tail(ran.stderr, 500)}")


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory):
  cxx = shutil.which("g++")
  if cxx is None:
    pytest.skip("no g++ to build the contract fuzzer with")
  work = tmp_path_factory.mktemp("contract_fuzz")
  env = _sanitizer_env(cxx, work)
  # One process per source: the driver is most of the time, and CI has 2 cores.
  objects = [work / (os.path.basename(source) + ".o") for source in SOURCES]
  jobs = [subprocess.Popen([cxx, *FLAGS, "-I", os.path.join(ROOT, "csrc"), "-c", os.path.join(ROOT, source),
                            "-o", str(obj)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
          for source, obj in zip(SOURCES, objects)]
  for job, source in zip(jobs, SOURCES):
    output, _ = job.communicate(timeout=fresh_process.HANG_GUARD_S)
    assert job.returncode == 0, f"compiling {source} failed:\n{_tail(output)}"
  binary = work / "contract_fuzz"
  linked = subprocess.run([cxx, *FLAGS, *map(str, objects), "-ldl", "-o", str(binary)], capture_output=True,
                          text=True)
  assert linked.returncode == 0, f"linking the fuzzer failed:\n{_tail(linked.stderr)}"
  return binary, env, work


def _counts(stdout: str) -> dict:
  return {name: (int(cases), int(accepted))
          for name, cases, accepted in re.findall(r"(\w+): (\d+) cases \((\d+) accepted\)", stdout)}


def test_the_corpus_replays_clean(fuzzer):
  binary, env, _ = fuzzer
  ran = subprocess.run([str(binary), CORPUS], capture_output=True, text=True, env=env,
                       timeout=fresh_process.HANG_GUARD_S)
  assert ran.returncode == 0, f"replaying tests/fuzz/corpus failed:\n{_tail(ran.stderr)}"
  print(ran.stdout.strip())
  assert sum(cases for cases, _ in _counts(ran.stdout).values()) == len(os.listdir(CORPUS))


def test_the_contract_survives_fuzzing(fuzzer, request):
  binary, env, work = fuzzer
  seed = int(os.environ.get("JMF_FUZZ_SEED") or int.from_bytes(os.urandom(4), "little"))
  request.node.user_properties.append(("seed", seed))
  ran = subprocess.run([str(binary), "--seconds", str(SECONDS), "--seed", str(seed), "--artifacts", str(work)],
                       capture_output=True, text=True, env=env, timeout=SECONDS + fresh_process.HANG_GUARD_S)
  print(ran.stdout.strip())
  # A failure leaves crash-SEED-N in `work`; `--seed SEED --cases N+1` runs
  # the same cases again anywhere.
  assert ran.returncode == 0, f"the fuzzer failed (seed {seed}):\n{_tail(ran.stderr)}"
  counts = _counts(ran.stdout)
  assert set(counts) == {"validator", "parser", "cliques"}, ran.stdout
  for name, (cases, accepted) in counts.items():
    assert cases >= MIN_CASES and accepted >= MIN_ACCEPTED, f"{name}: only {cases} cases, {accepted} accepted"
