"""NVRTC front end: compiling, names, targets, errors (no GPU needed)."""

import hashlib
import json
import os
import time

import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base import module_format
from jax_mosaic_ffi.cuda.nvrtc import worker as nvrtc_worker
from jax_mosaic_ffi.base.module_format import ImageKind

import fresh_process
import kernel_sources


def test_extern_c_kernel_keeps_its_name_and_signature(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  assert kernel.symbol == "add"
  assert kernel.param_sizes == (8, 8, 8, 4)
  kinds = [(i.kind, i.arch.sm) for i in kernel.images]
  assert kinds == [(ImageKind.CUBIN, "sm_90"), (ImageKind.PTX, "sm_90")]
  assert kernel.images[0].data[:4] == b"\x7fELF"
  assert b".entry add(" in kernel.images[1].data


def test_cpp_template_name_is_resolved_to_its_mangled_symbol(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.AXPB, "ops::axpb<__nv_bfloat16>", targets="sm_90")
  assert kernel.symbol.startswith("_ZN3ops4axpb")
  assert kernel.param_sizes == (8, 8, 8)
  assert kernel.name == "ops::axpb<__nv_bfloat16>"


def test_several_targets_give_one_cubin_each_and_the_first_ptx(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add", targets=("sm_80", "sm_90a"))
  assert [(i.kind, str(i.arch)) for i in kernel.images] == [
      (ImageKind.CUBIN, "sm_80"), (ImageKind.CUBIN, "sm_90a"), (ImageKind.PTX, "sm_80")]


@pytest.mark.skipif(gpu_info.has_gpu(), reason="checks the default without a GPU")
def test_default_target_without_a_gpu_is_sm_90(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert {str(i.arch) for i in kernel.images} == {"sm_90"}


def test_compile_error_carries_the_log_and_line_numbers(isolated_disk_cache):
  source = 'extern "C" __global__ void broken(float* x) {\n  x[0] = 1.0f;\n  x[1] = undefined_thing;\n}\n'
  with pytest.raises(jmf.CompileError) as info:
    jmf.cuda_kernel(source, "broken")
  message = str(info.value)
  assert "broken.cu(3)" in message
  assert "undefined_thing" in message
  assert "    3 |   x[1] = undefined_thing;" in message
  assert info.value.kernel == "broken"


def test_a_name_that_is_not_in_the_source_fails_to_compile(isolated_disk_cache):
  with pytest.raises(jmf.CompileError, match="no_such_kernel"):
    jmf.cuda_kernel(kernel_sources.ADD, "no_such_kernel")


def test_in_memory_headers_and_options(isolated_disk_cache):
  source = '#include "scale.h"\nextern "C" __global__ void k(float* x) { x[0] = SCALE * OFFSET; }'
  a = jmf.cuda_kernel(source, "k", headers={"scale.h": "#define SCALE 2.0f"}, options=["-DOFFSET=1.0f"])
  b = jmf.cuda_kernel(source, "k", headers={"scale.h": "#define SCALE 3.0f"}, options=["-DOFFSET=1.0f"])
  c = jmf.cuda_kernel(source, "k", headers={"scale.h": "#define SCALE 2.0f"}, options=["-DOFFSET=5.0f"])
  assert len({a.hash, b.hash, c.hash}) == 3


def test_arch_options_are_refused_in_favour_of_targets():
  with pytest.raises(ValueError, match="targets="):
    jmf.cuda_kernel(kernel_sources.ADD, "add", options=["--gpu-architecture=sm_80"])


def test_the_same_source_is_compiled_once_in_memory(isolated_disk_cache):
  before = jmf.kernel_cache_stats()
  first = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  second = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  after = jmf.kernel_cache_stats()
  assert first.hash == second.hash
  assert after.compiles["nvrtc"] - before.compiles["nvrtc"] == 1
  assert after.memory_hits - before.memory_hits == 1


def test_kernel_hash_is_the_sha256_of_the_module(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  assert kernel.hash == hashlib.sha256(kernel.module).digest()
  assert len(kernel.hash) == 32


def test_ptx_and_cubin_kernels_wrap_prebuilt_code(isolated_disk_cache):
  compiled = jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  ptx = next(i.data for i in compiled.images if i.kind == ImageKind.PTX)
  cubin = next(i.data for i in compiled.images if i.kind == ImageKind.CUBIN)
  from_ptx = jmf.ptx_kernel(ptx, "add")
  assert from_ptx.param_sizes == (8, 8, 8, 4)
  assert [(i.kind, str(i.arch)) for i in from_ptx.images] == [(ImageKind.PTX, "sm_90")]
  from_cubin = jmf.cubin_kernel({"sm_90": cubin}, "add")
  assert from_cubin.param_sizes is None
  assert module_format.parse(from_cubin.module).images[0].data == cubin
  assert from_cubin.parsed.images[0].data == cubin
  with pytest.raises(ValueError, match="no entry named 'nope'"):
    jmf.ptx_kernel(ptx, "nope")
  with pytest.raises(ValueError, match="not a cubin"):
    jmf.cubin_kernel({"sm_90": b"not an elf"}, "add")


@pytest.mark.parametrize("source, name, options, said", [
    (kernel_sources.ADD + "// \udcff", "add", (), r"the source holds '\\udcff' at character \d+, a lone surrogate"),
    (kernel_sources.ADD, "add\udcff", (), r"the kernel name 'add\\udcff' holds a lone surrogate"),
    (kernel_sources.ADD, "add", ("-DX=\udcff",), r"the option '-DX=\\udcff' holds '\\udcff'"),
    (kernel_sources.ADD, "add", ("--dlink-time-opt",), r"the option '--dlink-time-opt' makes NVRTC emit LTO IR"),
    (kernel_sources.ADD, "add", ("-dlto",), r"the option '-dlto' makes NVRTC emit LTO IR"),
])
def test_text_nvrtc_cannot_take_and_options_that_make_no_loadable_module_are_refused_by_name(
    isolated_disk_cache, source, name, options, said):
  with pytest.raises(ValueError, match=rf"^cuda_kernel( 'add')?: {said}"):
    jmf.cuda_kernel(source, name, options=options)


TEMPLATE_BOMB = r'''
template <int N, unsigned long long M> struct Bomb {
  static constexpr unsigned long long value = Bomb<N - 1, 2 * M>::value + Bomb<N - 1, 2 * M + 1>::value;
};
template <unsigned long long M> struct Bomb<0, M> { static constexpr unsigned long long value = M; };
extern "C" __global__ void bomb(unsigned long long* out) { out[0] = Bomb<40, 1>::value; }
'''


def test_a_compile_that_never_ends_is_stopped_and_the_next_one_works(isolated_disk_cache, tmp_path):
  # A fresh process whose temporary folder is this test's own: its worker's scratch folders are the only
  # jmf-nvrtc-* there, whatever else runs on the machine.
  temp = tmp_path / "tmp"
  temp.mkdir()
  script = """
      import glob, json, os, tempfile
      import fresh_process, jax_mosaic_ffi as jmf, kernel_sources, test_compile
      from jax_mosaic_ffi.cuda.nvrtc import worker
      scratch = os.path.join(tempfile.gettempdir(), "jmf-nvrtc-*")
      try:  # 2**40 instantiations: it never ends, whatever the machine's speed, so only the bound stops it
        jmf.cuda_kernel(test_compile.TEMPLATE_BOMB, "bomb")
        error = None
      except jmf.CompileError as e:
        error = str(e)
      # The next compile, in a new worker, under a bound that is only a hang guard (2 s is a measure of speed).
      os.environ["JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S"] = str(fresh_process.INNER_GUARD_S)
      symbol = jmf.cuda_kernel(kernel_sources.ADD, "add").symbol
      print(json.dumps({"error": error, "symbol": symbol, "scratch": sorted(glob.glob(scratch)),
                        "worker": worker._worker._scratch}))
  """
  r = fresh_process.run(script, env={"TMPDIR": str(temp), "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S": "2",
                                                  "JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}).result
  assert r["error"] and "did not finish within" in r["error"], r
  assert r["symbol"] == "add", r
  # The killed worker's scratch folder is removed with it; only the new worker's is there.
  assert r["worker"] and r["worker"].startswith(str(temp)) and r["scratch"] == [r["worker"]], r


ENDS = """
  import json, os, sys
  import jax_mosaic_ffi as jmf, kernel_sources, test_compile
  from jax_mosaic_ffi.cuda.nvrtc import worker
  jmf.cuda_kernel(kernel_sources.ADD, "add")  # its worker started
  print(json.dumps([worker._worker._process.pid, worker._worker._scratch]), flush=True)
  if sys.argv[1] == "exit":
    os._exit(0)  # no atexit handler runs
  os.chdir(sys.argv[2])  # the worker takes the caller's folder with each request: a sign that it compiles
  jmf.cuda_kernel(test_compile.TEMPLATE_BOMB, "bomb")  # never ends: this process is killed in it
"""


@pytest.mark.parametrize("how", ["exit", "killed"])
def test_a_caller_that_ends_outright_leaves_no_worker_and_no_scratch(tmp_path, how):
  # A caller killed in a compile, or ended by os._exit: its worker (and what the worker started) ends with it, and
  # the worker's jmf-nvrtc-* scratch folder is removed (the caller runs nothing: its guard does).
  temp, compiling = tmp_path / "tmp", tmp_path / "compiling"
  temp.mkdir()
  compiling.mkdir()
  caller = fresh_process.start(ENDS, how, compiling, env={
      "TMPDIR": str(temp), "JAX_MOSAIC_FFI_CACHE_DIR": "off",
      "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S": str(fresh_process.INNER_GUARD_S)})
  try:
    pid, scratch = json.loads(caller.stdout.readline())
    assert scratch.startswith(str(temp)) and os.path.isdir(scratch)
    deadline = time.monotonic() + fresh_process.INNER_GUARD_S  # a guard: the wait ends when the bomb compiles
    while how == "killed" and _cwd(pid) != str(compiling) and time.monotonic() < deadline:
      time.sleep(0.01)
  finally:
    if how == "killed":
      caller.kill()
    caller.communicate(timeout=fresh_process.HANG_GUARD_S)
  deadline = time.monotonic() + fresh_process.INNER_GUARD_S  # a guard: the guard acts at once
  while (_cwd(pid) is not None or os.path.exists(scratch)) and time.monotonic() < deadline:
    time.sleep(0.01)
  assert _cwd(pid) is None, "the worker outlived its caller"
  assert not os.path.exists(scratch) and not list(temp.iterdir())


def _cwd(pid: int) -> str | None:
  """A running process's working folder (None: it has ended; a zombie has none)."""
  try:
    return os.readlink(f"/proc/{pid}/cwd")
  except OSError:
    return None


FORKED = """
  import json, os, threading, time, traceback
  import fresh_process, jax_mosaic_ffi as jmf, kernel_sources, test_compile
  from jax_mosaic_ffi.cuda.nvrtc import worker
  jmf.cuda_kernel(kernel_sources.ADD, "add")  # the parent's worker, started
  parent_worker, scratch = worker._worker._process.pid, worker._worker._scratch

  def forked_compile(name):
    # A child: a compile of its own, then what its exit does. Its exit status, or None where it hung.
    child = os.fork()
    if child == 0:
      code = 1
      try:
        jmf.cuda_kernel(kernel_sources.ADD.replace("add", name), name)
        code = 0 if worker._worker._process.pid != parent_worker else 2
        worker._worker.close()
      except BaseException:
        traceback.print_exc()
      os._exit(code)
    deadline = time.monotonic() + fresh_process.INNER_GUARD_S
    while time.monotonic() < deadline:
      done, raw = os.waitpid(child, os.WNOHANG)
      if done:
        return os.waitstatus_to_exitcode(raw)
      time.sleep(0.05)
    os.kill(child, 9)  # hung: waiting for a lock a thread of the parent held when it forked
    os.waitpid(child, 0)
    return None

  in_flight = {}

  def slow_compile():
    try:
      in_flight["symbol"] = jmf.cuda_kernel(test_compile.TEMPLATE_BOMB.replace("Bomb<40, 1>", "Bomb<12, 1>"),
                                            "bomb").symbol
    except Exception as e:
      in_flight["error"] = f"{type(e).__name__}: {e}"

  thread = threading.Thread(target=slow_compile)
  thread.start()
  while not worker._worker._lock.locked() and thread.is_alive():  # until the parent's compile is in its worker
    time.sleep(0.001)
  held = worker._worker._lock.locked()
  during = forked_compile("child_during")  # while a compile of the parent is in flight, its lock held
  thread.join()
  idle = forked_compile("child_idle")
  alive = worker._worker._process is not None and worker._worker._process.poll() is None
  same = alive and worker._worker._process.pid == parent_worker
  scratch_kept = os.path.isdir(scratch)
  after = jmf.cuda_kernel(kernel_sources.ADD.replace("add", "after_add"), "after_add").symbol
  print(json.dumps({"children": [during, idle], "held": held, "in_flight": in_flight, "same_worker": same,
                    "scratch_kept": scratch_kept, "after": after,
                    "still_same_worker": worker._worker._process.pid == parent_worker}))
"""


def test_a_forked_child_leaves_the_parents_worker_and_compiles_with_its_own(tmp_path):
  # Children made by os.fork (multiprocessing's default on Linux) compile, one while a compile of the parent is in
  # flight: the parent's worker, its scratch folder and its compiles are untouched, and the children's compile.
  r = fresh_process.run(FORKED, env={"JAX_MOSAIC_FFI_CACHE_DIR": "off", "TMPDIR": str(tmp_path)}).result
  assert r["children"] == [0, 0] and r["held"], r  # the first child forked while the parent's compile ran
  assert r["in_flight"] == {"symbol": "bomb"}, r
  assert r["same_worker"] and r["scratch_kept"] and r["still_same_worker"] and r["after"] == "after_add", r


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf", "-inf"])
def test_a_bad_compile_timeout_is_named_before_compiling(isolated_disk_cache, monkeypatch, value):
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S", value)
  with pytest.raises(ValueError, match="JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S"):
    jmf.cuda_kernel(kernel_sources.ADD, "add")


@pytest.mark.parametrize("value", ["1e10", "1e300"])
def test_a_huge_compile_timeout_is_taken_as_the_longest_bound(isolated_disk_cache, monkeypatch, value):
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S", value)
  assert jmf.cuda_kernel(kernel_sources.ADD, "add").symbol == "add"  # in the worker, not OverflowError
  assert nvrtc_worker.timeout_s() == nvrtc_worker.MAX_TIMEOUT_S


def test_a_worker_that_prints_on_its_stdout_still_answers(isolated_disk_cache, tmp_path):
  # A sitecustomize runs in every interpreter, the compile worker's too.
  site = tmp_path / "site"
  site.mkdir()
  (site / "sitecustomize.py").write_text("print('hello from sitecustomize', flush=True)\n")
  script = """
      import json
      import jax_mosaic_ffi as jmf, kernel_sources
      k = jmf.cuda_kernel(kernel_sources.ADD, "add")
      print(json.dumps([k.symbol, jmf.kernel_cache_stats().compiles["nvrtc"]]))
  """
  result = fresh_process.run(script, cwd=tmp_path, env={
      "JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache),
      "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)})
  assert result.result == ["add", 1]
  assert result.stdout.count("hello from sitecustomize") == 2  # this process's and the worker's, not swallowed


def test_compiling_in_this_process_gives_the_same_binary(isolated_disk_cache, monkeypatch):
  bounded = jmf.cuda_kernel(kernel_sources.SUM, "block_sum")
  jmf.clear_kernel_cache(disk=True)
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S", "0")
  assert jmf.cuda_kernel(kernel_sources.SUM, "block_sum").module == bounded.module
