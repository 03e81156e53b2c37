"""Kernel packs end to end, each step in a fresh process: `python -m jax_mosaic_ffi.pack record` runs
tests/pack_program.py (a kernel of every front end) on the CPU once per arch, and a process with the pack and an
empty disk cache lowers it compiling nothing, with NVRTC made impossible to load (any compile fails there) and the
strict mode on. Listing, pruning and merging; a pack made under the oldest jax loaded by this one; on a GPU, the
packed kernels run, their outputs checked against numpy and against the same kernels compiled. Without Triton the
recording and the checks leave out its front ends (Triton's, Gluon's); without the CuTe DSL, the CuTe DSL's."""

import importlib.util
import json
import os
import secrets
import subprocess
import sys

import pytest

from jax_mosaic_ffi.base import pack_file
from jax_mosaic_ffi.cute.compiler import package as cute_package

import fresh_process

TESTS = os.path.dirname(os.path.abspath(__file__))
PROGRAM = os.path.join(TESTS, "pack_program.py")
OLD_JAX_PACK = os.path.join(TESTS, "data", "jax0112.jmfpack")
HAS_TRITON = importlib.util.find_spec("triton") is not None
NO_TRITON = "triton is not installed (pip install 'jax_mosaic_ffi[triton]')"
WITHOUT_CUTE = "cuda,tuned" + ",triton,gluon" * HAS_TRITON
# What the pack is recorded from: every front end installed here. (The program's own default, all of them, needs
# them all; its lines stay where they are, as tests/data/jax0112.jmfpack's Triton key holds its line numbers.)
INSTALLED = WITHOUT_CUTE + ",cute" * (cute_package.compiler_release() is not None)
# A sitecustomize that makes cuda-python's NVRTC module unimportable, in the child and in NVRTC's worker process
# (which inherits PYTHONPATH): no compile can run there. The CuTe DSL imports that module itself, so its call is
# lowered in a child of its own, where the counters show that nothing compiles.
NO_NVRTC = "import sys\nsys.modules['cuda.bindings.nvrtc'] = None\n"


def _cli(*args, env=None, timeout=900) -> subprocess.CompletedProcess:
  environment = {**os.environ, **(env or {})}
  environment["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, environment.get("PYTHONPATH")) if p)
  return subprocess.run([sys.executable, "-m", "jax_mosaic_ffi.pack", *args], env=environment, capture_output=True,
                        text=True, timeout=timeout, cwd=fresh_process.private_folder())


def _program(pack: str, cache: str, *args, targets: str | None = None, nvrtc: bool = True, strict: bool = True,
             check: bool = True) -> fresh_process.Finished:
  env = {"JAX_MOSAIC_FFI_PACKS": pack, "JAX_MOSAIC_FFI_CACHE_DIR": cache,
         "JAX_MOSAIC_FFI_PACKS_STRICT": "1" if strict else "0"}
  if targets is not None:
    env["JAX_MOSAIC_FFI_TARGETS"] = targets
  if not nvrtc:
    blocker = os.path.join(cache + "-site")
    os.makedirs(blocker, exist_ok=True)
    with open(os.path.join(blocker, "sitecustomize.py"), "w") as f:
      f.write(NO_NVRTC)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (blocker, os.environ.get("PYTHONPATH")) if p)
  return fresh_process.run(f"import runpy, sys; sys.argv = {[PROGRAM, *args]!r}; runpy.run_path({PROGRAM!r}, "
                           "run_name='__main__')", env=env, check=check, timeout=600)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
  """The program recorded for sm_90a and sm_100a (two runs on the CPU) into one pack."""
  folder = tmp_path_factory.mktemp("pack")
  path = str(folder / "model.jmfpack")
  done = _cli("record", path, "--arch", "sm_90a,sm_100a", "--", sys.executable, PROGRAM, "lower", INSTALLED,
              env={"JAX_MOSAIC_FFI_CACHE_DIR": str(folder / "cache")})
  assert done.returncode == 0, done.stderr[-4000:]
  return path, done.stdout


def _compiles(counters: dict) -> int:
  return sum(counters["compiles"].values())


@pytest.mark.parametrize("gpu", ["sm_90", "sm_100"])
def test_a_fresh_process_with_the_pack_and_no_nvrtc_compiles_nothing(recorded, tmp_path, gpu):
  path, _ = recorded
  cache = str(tmp_path / "empty-cache")
  lowered = _program(path, cache, "lower", WITHOUT_CUTE, targets=gpu, nvrtc=False).result
  assert lowered["calls"] == {name: "lowered" for name in WITHOUT_CUTE.split(",")}
  counters = lowered["counters"]
  # The CUDA kernel, the autotuned call's default config (a CPU lowering builds only that), Triton's, Gluon's.
  assert _compiles(counters) == 0 and counters["pack_hits"] == 2 + 2 * HAS_TRITON and counters["disk_hits"] == 0
  assert not os.listdir(cache) if os.path.exists(cache) else True  # nothing compiled, so nothing stored
  # There, any compile fails: a kernel the pack does not hold cannot be built.
  new = _program(path, cache, "new", targets=gpu, nvrtc=False, strict=False, check=False)
  assert new.returncode != 0 and "compiles CUDA C++ with NVRTC through cuda-python" in new.stderr


@pytest.mark.skipif(cute_package.compiler_release() is None, reason="nvidia-cutlass-dsl is not installed")
@pytest.mark.parametrize("gpu", ["sm_90", "sm_100"])
def test_a_cute_dsl_kernel_comes_from_the_pack(recorded, tmp_path, gpu):
  counters = _program(recorded[0], str(tmp_path / "cache"), "lower", "cute", targets=gpu).result["counters"]
  assert _compiles(counters) == 0 and counters["pack_hits"] == 1


def test_strict_mode_names_what_the_pack_lacks_and_how_to_add_it(recorded, tmp_path):
  failed = _program(recorded[0], str(tmp_path / "cache"), "lower", "cuda", targets="sm_120", check=False)
  assert failed.returncode != 0
  error = failed.stderr[failed.stderr.index("NotInPacks"):]
  assert "CUDA C++ (NVRTC) 'scale_add' at pack_program.py:" in error and "targets: sm_120" in error
  assert "python -m jax_mosaic_ffi.pack record new.jmfpack --arch sm_120 -- python " in error
  assert "what differs: targets: sm_90 in the pack, sm_120 here" in error or "sm_100 in the pack, sm_120 here" in error


def test_the_listing_names_each_kernel_arch_and_the_calls_without_a_winner(recorded):
  path, recorded_output = recorded
  assert "autotuned pack_program.triple float32[4096] on sm_90: no tuning file measured" in recorded_output
  listing = _cli("list", path).stdout
  kernels = ["'scale_add' for sm_90,", "'scale_add' for sm_100,", "'triple' for sm_90,", "jax_mosaic_ffi: ",
             "recorded_for: sm_100, sm_90"] + ["'add_scaled' for sm_90,", "Gluon 'add_one' for sm_100,"] * HAS_TRITON
  for kernel in kernels:
    assert kernel in listing, listing
  assert "autotuned calls without a winner (they would time their configs there) (2):" in listing
  as_json = json.loads(_cli("list", path, "--json").stdout)
  # Triton's specializations are packed beside its compiles.
  assert {e["kind"] for e in as_json["entries"]} == ({"compile", "specialization"} if HAS_TRITON else {"compile"})
  assert all(len(e["sha256"]) == 64 and e["bytes"] > 0 for e in as_json["entries"])


def test_check_says_how_each_gpu_would_be_served_by_the_recorded_pack(recorded):
  done = _cli("check", recorded[0], "--fleet", "sm_90,sm_100,sm_103")
  assert done.returncode == 1, done.stdout  # the autotuned call has no winner
  scale_add = done.stdout[done.stdout.index("'scale_add'"):]
  # sm_103 was not recorded: its major version's sm_100 cubin loads there, and the node takes it with no setting.
  assert scale_add.startswith("'scale_add' (options: none; headers given: none):\n    sm_90: exact cubin: cubin sm_90\n"
                              "    sm_100: exact cubin: cubin sm_100\n    sm_103: family cubin: cubin sm_100 (the node "
                              "takes sm_100's entry by itself: no setting)\n")


def test_check_with_a_program_lists_every_compile_the_pack_lacks_in_one_go(recorded):
  done = _cli("check", recorded[0], "--fleet", "sm_90,sm_103", "--", "python", PROGRAM, "new")
  assert done.returncode == 1, done.stderr[-3000:]
  for gpu in ("sm_90", "sm_103"):
    assert f"PROBLEM: {gpu}: CUDA C++ (NVRTC) 'not_packed' for {gpu} at pack_program.py:" in done.stdout, done.stdout
  assert done.stdout.rstrip().endswith("2 compiles of python " + PROGRAM + " new not in the pack")


def test_a_family_target_serves_every_gpu_of_its_family(tmp_path):
  path = str(tmp_path / "family.jmfpack")
  cute = cute_package.compiler_release() is not None  # the CuTe DSL builds family targets too
  done = _cli("record", path, "--arch", "sm_100f", "--", sys.executable, PROGRAM, "lower", "cuda,cute" if cute else
              "cuda", env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")})
  assert done.returncode == 0, done.stderr[-4000:]
  check = _cli("check", path, "--fleet", "sm_100,sm_103,sm_120")
  no_setting = "(the node takes sm_100f's entry by itself: no setting)"
  assert f"sm_103: family cubin: cubin sm_100f {no_setting}" in check.stdout
  if cute:
    assert f"sm_103: family cubin: cute sm_100f {no_setting}" in check.stdout
  assert "sm_120: PROBLEM: missing: not recorded for sm_120" in check.stdout and check.returncode == 1
  # A node told the family target (a B300's, say) lowers from the pack, compiling nothing.
  counters = _program(path, str(tmp_path / "node"), "lower", "cuda", targets="sm_100f", nvrtc=False).result["counters"]
  assert _compiles(counters) == 0 and counters["pack_hits"] == 1


def test_prune_and_merge(recorded, tmp_path):
  path = recorded[0]
  whole = pack_file.read(path)
  parts = []
  for arch in ("sm_90", "sm_100a"):
    part = str(tmp_path / f"{arch}.jmfpack")
    assert _cli("prune", part, path, "--arch", arch).returncode == 0
    parts.append(pack_file.read(part))
  numbers = [{t.removeprefix("sm_").rstrip("a") for e in p.entries.values() for t in e.about["targets"]}
             for p in parts]
  assert numbers == [{"90"}, {"100"}]
  assert set(parts[0].entries).isdisjoint(parts[1].entries)
  merged = str(tmp_path / "merged.jmfpack")
  assert _cli("merge", merged, parts[0].path, parts[1].path).returncode == 0
  assert set(pack_file.read(merged).entries) == set(whole.entries)
  # The pruned pack serves sm_100 alone: sm_90 is not in it.
  failed = _program(parts[1].path, str(tmp_path / "cache"), "lower", "cuda", targets="sm_90", check=False)
  assert failed.returncode != 0 and "NotInPacks" in failed.stderr


def test_a_pack_recorded_twice_in_fresh_processes_is_bit_identical_for_every_arch(tmp_path):
  # NVRTC with its time trace on made other code for sm_100 and sm_120 in one process and the next, and without a
  # seed it names a template kernel's internal-linkage symbols at random: every CI run gave the pack a new digest.
  digests, payloads = [], []
  for run in range(2):
    path = str(tmp_path / f"run{run}.jmfpack")
    done = _cli("record", path, "--arch", "sm_90a,sm_100a,sm_120a", "--", sys.executable, PROGRAM, "lower",
                "cuda,template,targets", env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / f"cache{run}")})
    assert done.returncode == 0, done.stderr[-4000:]
    pack = pack_file.read(path)
    digests.append(pack.digest)
    payloads.append({(e.about["kernel"], *e.about["targets"]): e.sha256 for e in pack.entries.values()})
  assert {kernel for kernel, *_ in payloads[0]} == {"scale_add", "scale_add_t<2>"}
  assert {target for _, *targets in payloads[0] for target in targets} == {
      "sm_90", "sm_100", "sm_120", "sm_90a", "sm_100a", "sm_120a", "sm_100f", "sm_120f"}
  assert payloads[0] == payloads[1] and digests[0] == digests[1]


@pytest.mark.skipif(not HAS_TRITON, reason=f"the pack holds a Triton kernel: {NO_TRITON}")
def test_a_pack_made_under_the_oldest_jax_serves_this_one(tmp_path):
  pack = pack_file.read(OLD_JAX_PACK)
  assert pack.created["jax"] == "0.11.2"
  import jax
  import triton
  from jax_mosaic_ffi.cuda.nvrtc import compiler
  made_with = set(pack.created["toolchains"])
  here = {compiler.nvrtc_identity(), f"triton {triton.__version__}"}
  if made_with != here:
    pytest.skip(f"{OLD_JAX_PACK} was made with {sorted(made_with)}; this venv has {sorted(here)}: rebuild it with "
                "bash tests/data/make_pack_jax0112.sh")
  result = _program(OLD_JAX_PACK, str(tmp_path / "cache"), "lower", "cuda,triton", targets="sm_90", nvrtc=False,
                    check=False)
  assert result.returncode == 0, (f"jax {jax.__version__} did not serve every kernel of {OLD_JAX_PACK} (a compile key "
                                  "changed? rebuild it with bash tests/data/make_pack_jax0112.sh):\n"
                                  f"{result.stderr[-3000:]}")
  counters = result.result["counters"]
  assert _compiles(counters) == 0 and counters["pack_hits"] == 2


# ----------------------------------------------------------------------------------------------- on a GPU


def _gpu_arch() -> str:
  from jax_mosaic_ffi.base import gpu_info
  return f"sm_{gpu_info.visible_gpus()[0].arch}"


@pytest.mark.gpu
def test_packed_kernels_run_and_match_numpy_and_the_compiled_ones(tmp_path):
  """On this GPU: tune the autotuned call and save its timings, record the program on the CPU for this GPU's arch
  with that tuning file, then run every call from the pack in a fresh process with an empty cache (nothing
  compiled, nothing timed) and compiled in another, on the same fresh random inputs: each output checked against
  numpy (in pack_program.py) and the two equal bit for bit."""
  arch, seed = _gpu_arch(), str(secrets.randbits(31))
  names = WITHOUT_CUTE + (",cute" if cute_package.compiler_release() and int(arch[3:]) >= 90 else "")
  tuning = str(tmp_path / "tuning.json")
  fresh_process.run(f"""
      import runpy, sys
      sys.argv = [{PROGRAM!r}, "run", "tuned", "0"]
      runpy.run_path({PROGRAM!r}, run_name="__main__")
      import jax_mosaic_ffi as jmf
      assert jmf.save_tuning({tuning!r}) >= 2
      """, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "tune-cache")}, timeout=600)
  os.chmod(tuning, 0o644)
  path = str(tmp_path / "gpu.jmfpack")
  done = _cli("record", path, "--arch", arch, "--tuning", tuning, "--", sys.executable, PROGRAM, "lower", names,
              env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "record-cache")})
  assert done.returncode == 0 and "(1 winners)" in done.stdout, done.stdout + done.stderr[-3000:]
  packed = _program(path, str(tmp_path / "empty-cache"), "run", names, seed).result
  counters = packed["counters"]
  assert _compiles(counters) == 0 and counters["autotune_tunings"] == 0 and counters["autotune_pack_hits"] == 1
  assert ["pack_program.triple", "pack"] in packed["report"]
  compiled = _program("", str(tmp_path / "compile-cache"), "run", names, seed, strict=False).result
  assert _compiles(compiled["counters"]) > 0
  for name in names.split(","):
    assert packed["calls"][name] == compiled["calls"][name], name


CRASHING = '''
import os, sys
import jax, jax.numpy as jnp
import cuda.bindings.driver as cuda
import cutlass.cute as cute
import jax_mosaic_ffi as jmf

@cute.jit
def crashes(stream: cuda.CUstream, x: cute.Tensor, y: cute.Tensor):
  os._exit(3)  # the process ends inside the compile, as a compiler's native crash ends it

x = jax.ShapeDtypeStruct((128,), jnp.float32)
jax.jit(jmf.mosaic_kernel(jmf.cute_kernel(crashes), lambda v: v)).trace(x).lower(lowering_platforms=("cuda",))
'''


@pytest.mark.skipif(cute_package.compiler_release() is None, reason="nvidia-cutlass-dsl is not installed")
def test_a_compile_that_ends_the_process_is_listed_as_refused(tmp_path):
  program = tmp_path / "crashing.py"
  program.write_text(CRASHING)
  path = str(tmp_path / "crashed.jmfpack")
  # Unbounded, the compile runs in the program's process, which it ends (bounded, a forked child would end instead:
  # tests/test_cute_bounds.py).
  done = _cli("record", path, "--arch", "sm_90", "--", sys.executable, str(program),
              env={"JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache"), "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S": "0"})
  assert done.returncode == 1 and "sm_90: the program exited with status 3" in done.stderr
  assert "refused: CuTe DSL 'crashes' for sm_90a: the process ended while this compile ran" in done.stdout
  (refused,) = pack_file.read(path).notes["refused"]
  assert refused["recorded_for"] == ["sm_90"] and refused["call_sites"][0].startswith("crashing.py:")
