"""A program's kernels side by side (jmf.compile_ahead, store/ahead.py): compiles started at cuda_kernel(...) on a
bounded pool, the kernel waiting for its own when asked, errors as without the block, a warm cache as it was.
Ordered by a barrier and events, never by time."""

import threading
import traceback

import jax
import numpy as np
import pytest

import fresh_process
import jax_mosaic_ffi as jmf
import kernel_sources
from test_packs import _recorded, clean_packs  # noqa: F401  (a fixture)
from jax_mosaic_ffi.cuda.nvrtc import worker
from jax_mosaic_ffi.store import packs
from jax_mosaic_ffi.store import stack
from jax_mosaic_ffi.toolchain.compiled import Compiled, PendingCompiled

BROKEN = 'extern "C" __global__ void broken(float* y) { y[0] = undefined; }'


def _source(k: int) -> str:
  return kernel_sources.ADD.replace("add(", f"add_{k}(")


def _compiles() -> int:
  return sum(jmf.kernel_cache_stats().compiles.values())


def test_kernels_made_ahead_are_the_kernels_made_one_by_one_each_compiled_once(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_JOBS", "2")
  before = _compiles()
  with jmf.compile_ahead():
    kernels = [jmf.cuda_kernel(_source(k), f"add_{k}") for k in range(4)]
    again = jmf.cuda_kernel(_source(0), "add_0")  # the same compile, in flight or done: never made twice
    assert all(isinstance(k.compiled, PendingCompiled) for k in kernels)
  assert _compiles() - before == 4
  assert again.hash == kernels[0].hash
  assert len(worker._workers) <= 2  # NVRTC's workers: no more than the pool's compiles
  jmf.clear_kernel_cache()  # the memory tier: the disk cache serves the same kernels, made one by one
  monkeypatch.setenv("JAX_MOSAIC_FFI_CACHE_DIR", "off")
  alone = [jmf.cuda_kernel(_source(k), f"add_{k}") for k in range(4)]
  assert [k.hash for k in alone] == [k.hash for k in kernels]
  assert [k.param_types for k in alone] == [k.param_types for k in kernels]


def test_compiles_made_ahead_run_side_by_side_on_the_pool(isolated_disk_cache, monkeypatch):
  """Each make waits at a barrier of two: the block ends only if the pool runs two at once."""
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_JOBS", "2")
  both = threading.Barrier(2, timeout=fresh_process.INNER_GUARD_S)
  run = stack._run

  def together(make, ask):
    both.wait()
    return run(make, ask)
  monkeypatch.setattr(stack, "_run", together)
  with jmf.compile_ahead():
    kernels = [jmf.cuda_kernel(_source(k), f"add_{k}") for k in (10, 11)]
  assert [k.symbol for k in kernels] == ["add_10", "add_11"]


def test_a_kernel_in_memory_is_served_at_once_as_without_the_block(isolated_disk_cache):
  made = jmf.cuda_kernel(_source(20), "add_20")
  with jmf.compile_ahead():
    again = jmf.cuda_kernel(_source(20), "add_20")
  assert type(again.compiled) is Compiled and again.compiled is made.compiled


def _made_here(source, name):
  return jmf.cuda_kernel(source, name)  # the line the error names


def test_a_compile_error_made_ahead_is_the_same_error_and_ends_on_the_line_that_made_the_kernel(isolated_disk_cache):
  line = _made_here.__code__.co_firstlineno + 1
  with pytest.raises(jmf.CompileError) as alone:
    _made_here(BROKEN, "broken")
  jmf.clear_kernel_cache()
  with pytest.raises(jmf.CompileError) as ahead:
    with jmf.compile_ahead():
      kernel = _made_here(BROKEN, "broken")
  assert str(ahead.value) == str(alone.value) and f"test_compile_ahead.py:{line} (_made_here)" in str(ahead.value)
  last = traceback.extract_tb(ahead.value.__traceback__)[-1]
  assert (last.filename, last.lineno) == (__file__, line)
  # Asked for again (its mosaic_kernel, its attributes): the same error, again ending on that line.
  with pytest.raises(jmf.CompileError) as used:
    jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((8,), np.float32), grid=1, block=8)
  assert str(used.value) == str(alone.value)
  assert traceback.extract_tb(used.value.__traceback__)[-1].lineno == line


def test_a_kernel_needed_inside_the_block_is_waited_for_there(isolated_disk_cache):
  with jmf.compile_ahead():
    kernel = jmf.cuda_kernel(_source(30), "add_30")
    call = jmf.mosaic_kernel(kernel, lambda a, b: a, grid=1, block=8, scalars=(np.int32(8),))
    lowered = jax.jit(call).trace(*[jax.ShapeDtypeStruct((8,), np.float32)] * 2).lower(lowering_platforms=("cuda",))
  assert "add_30" in lowered.as_text()


@pytest.mark.parametrize("value", ["many", "0", "-2", "1.5"])
def test_a_bad_compile_jobs_setting_is_named(isolated_disk_cache, monkeypatch, value):
  monkeypatch.setenv("JAX_MOSAIC_FFI_COMPILE_JOBS", value)
  with pytest.raises(ValueError, match="JAX_MOSAIC_FFI_COMPILE_JOBS"):
    with jmf.compile_ahead():
      jmf.cuda_kernel(_source(40), "add_40")


def test_pack_recording_strict_packs_and_the_key_audit_see_compiles_made_ahead(clean_packs, monkeypatch):  # noqa: F811
  """Recorded ahead, built into a pack, served from it strictly ahead; a kernel missing from it is the same
  NotInPacks as one by one, naming the line that made it; a disk hit made ahead is proven by the key audit."""
  def made_ahead():
    with jmf.compile_ahead():
      return [jmf.cuda_kernel(_source(k), f"add_{k}") for k in (50, 51)]
  path, built = _recorded(clean_packs, monkeypatch, made_ahead)
  assert len(built.entries) == 2
  monkeypatch.setenv(packs.PACKS_ENV, path)
  monkeypatch.setenv(packs.STRICT_ENV, "1")
  before = jmf.kernel_cache_stats()
  assert [k.symbol for k in made_ahead()] == ["add_50", "add_51"]
  after = jmf.kernel_cache_stats()
  assert after.pack_hits - before.pack_hits == 2 and after.compiles == before.compiles
  with pytest.raises(jmf.NotInPacks) as alone:
    _made_here(_source(52), "add_52")
  with pytest.raises(jmf.NotInPacks) as ahead:
    with jmf.compile_ahead():
      _made_here(_source(52), "add_52")
  assert str(ahead.value) == str(alone.value)
  monkeypatch.delenv(packs.STRICT_ENV)
  monkeypatch.delenv(packs.PACKS_ENV)
  packs.forget()
  jmf.cuda_kernel(_source(53), "add_53")
  jmf.clear_kernel_cache()  # memory only: the disk cache serves it, and the audit proves the hit
  monkeypatch.setenv("JAX_MOSAIC_FFI_KEY_AUDIT", "1")
  audits = jmf.kernel_cache_stats().store.get("compile", {}).get("audits", 0)
  with jmf.compile_ahead():
    kernel = jmf.cuda_kernel(_source(53), "add_53")
  assert kernel.symbol == "add_53"
  assert jmf.kernel_cache_stats().store["compile"]["audits"] == audits + 1
