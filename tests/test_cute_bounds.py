"""A CuTe DSL compile under JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S, with the real DSL on the CPU: past the bound it is
stopped in whatever it was doing (the launcher's trace, the DSL's passes, ptxas), its process killed
(toolchain/forked_compile.py), naming the kernel and the stage; this process goes on, and nothing is kept."""

import jax
import jax.numpy as jnp
import pytest

import cute_required  # noqa: F401  (skips without nvidia-cutlass-dsl)
import jax_mosaic_ffi as jmf

import cute_kernels as K
import fresh_process
from hlo_inspect import lower

TIMEOUT = "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S"
X = jax.ShapeDtypeStruct((128,), jnp.float32)
STAGE = r"the compile \(the launcher's trace, the DSL's MLIR passes, ptxas: one call\) for sm_90a"


def unrolled(steps: int):
  return lambda x: jmf.mosaic_kernel(jmf.cute_kernel(K.unrolled, steps=steps, targets=("sm_90a",)),
                                     lambda x: x)(x)


def test_a_cute_compile_past_the_bound_is_stopped_naming_the_kernel_and_its_stage(isolated_disk_cache, monkeypatch):
  monkeypatch.setenv(TIMEOUT, "0.001")  # its process takes longer to start, on any machine
  with pytest.raises(jmf.CompileTimeout, match=rf"^CuTe DSL could not compile 'unrolled' for sm_90a \(called at "
                                               rf"test_cute_bounds.py:\d+ \(<lambda>\)\):\nthe compile ran past "
                                               rf"JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=0.001 seconds in {STAGE}, and its "
                                               rf"process was killed\n\nadvice: .*unroll less, or raise "
                                               rf"JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S \(0: no bound\)\n") as caught:
    lower(unrolled(4), X)
  assert caught.value.kernel == "unrolled" and caught.value.compiler == "CuTe DSL"
  before = jmf.kernel_cache_stats().compiles["cute"]
  monkeypatch.setenv(TIMEOUT, "0")  # no bound: compiled in this process; nothing was kept of the stopped one
  lower(unrolled(4), X)
  assert jmf.kernel_cache_stats().compiles["cute"] == before + 1


def test_an_unrolled_trace_is_stopped(isolated_disk_cache, monkeypatch):
  # 2**40 unrolled loads: a trace that cannot finish, on any machine, so only the bound stops it.
  monkeypatch.setenv(TIMEOUT, "2")
  with pytest.raises(jmf.CompileTimeout, match=rf"ran past JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=2 seconds in {STAGE}"):
    lower(unrolled(2**40), X)
  monkeypatch.setenv(TIMEOUT, str(fresh_process.INNER_GUARD_S))  # a bound that is only a hang guard
  lower(unrolled(8), X)  # compiled, in a process as it was


def test_the_pieces_of_one_compile_share_one_deadline(isolated_disk_cache, monkeypatch):
  # The IR key's trace and the compile's each take 0.6 of the bound: one deadline stops the compile, wherever the
  # time went (a fresh bound per piece let it finish, at up to twice the bound).
  monkeypatch.setenv(TIMEOUT, "10")
  monkeypatch.setenv("JMF_TEST_TRACE_SLEEP_S", "6")
  with pytest.raises(jmf.CompileTimeout, match=r"ran past JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=10 seconds"):
    lower(lambda x: jmf.mosaic_kernel(jmf.cute_kernel(K.sleeps_in_its_trace, targets=("sm_90a",)), lambda x: x)(x),
          X)


def test_a_compile_that_ends_its_process_is_an_error_here(isolated_disk_cache):
  # Where the key reader does not read the launcher whole, its IR key's trace is the first to end its process.
  with pytest.raises(jmf.CompileError, match=r"'ends_the_process' for sm_90a .*\nthe compile's process ended \(exit "
                                             rf"status 3\) in ({STAGE}|the launcher's trace for its IR key for "
                                             r"sm_90a), without a result; this process is unharmed"):
    lower(lambda x: jmf.mosaic_kernel(jmf.cute_kernel(K.ends_the_process, targets=("sm_90a",)), lambda x: x)(x), X)
  lower(unrolled(4), X)  # and it goes on
