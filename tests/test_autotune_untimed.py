"""`mosaic_kernel(..., configs=[...], fallback=fn)` where nothing can be timed (no GPU): nothing built, chosen or
said while the fallback runs; a program lowered for CUDA builds the default config there (transforms/untimed.py)."""

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.transforms import autotune as autotuning

import kernel_sources
from hlo_inspect import custom_calls

pytestmark = pytest.mark.skipif(gpu_info.has_gpu(), reason="checks what autotuning does without a GPU")


def stats():
  return jmf.kernel_cache_stats()


def typed_add_with_configs(fallback=lambda x, y: x + y):
  """An add over the configs' blocks, with a fallback, as a user writes `mosaic_kernel(..., configs=, fallback=)`."""
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  return jmf.mosaic_kernel(kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x, y: jmf.cdiv(x.size, meta["block"]),
                           block=lambda meta, x, y: meta["block"], scalars=lambda meta, x, y: (np.int32(x.size),),
                           configs=[{"block": 64}, {"block": 128}], autotune_default=1, fallback=fallback)


def test_without_a_gpu_a_call_with_configs_and_a_fallback_builds_and_says_nothing(isolated_disk_cache, monkeypatch):
  # Nothing can be timed and the fallback runs: no config is built (a Triton kernel would compile here), none
  # chosen, nothing warned; under vmap and nested vmap too.
  monkeypatch.delenv(autotuning.CPU_ENV, raising=False)
  import triton_required
  triton_required.import_triton()
  import triton_sources
  call = jmf.mosaic_kernel(jmf.triton_kernel(triton_sources.add), lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x, y: jmf.cdiv(x.size, meta["BLOCK"]),
                           scalars=lambda meta, x, y: (np.int32(x.size),),
                           configs=[{"BLOCK": 128}, {"BLOCK": 256}], fallback=lambda x, y: x + y)
  x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
  before, reports = stats(), len(jmf.autotune_report())
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    np.testing.assert_array_equal(np.asarray(jax.jit(call)(x, x)), x + x)
    np.testing.assert_array_equal(np.asarray(call(x, x)), x + x)
    batch = np.stack([x, 2 * x, 3 * x])
    np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(call))(batch, batch)), batch + batch)
    nested = jax.vmap(jax.vmap(call, in_axes=(0, None)), in_axes=(None, 0))(batch, batch[:2])
    np.testing.assert_array_equal(np.asarray(nested), batch[None, :, :] + batch[:2, None, :])
  after = stats()
  assert after.compiles["triton"] == before.compiles["triton"] and after.autotune_skipped == before.autotune_skipped
  assert len(jmf.autotune_report()) == reports


def test_without_a_gpu_a_check_says_no_kernel_ran(isolated_disk_cache, monkeypatch):
  # The fallback stands in for every config's kernel: jmf.check must not call that a pass.
  monkeypatch.delenv(autotuning.CPU_ENV, raising=False)
  x = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
  report = jmf.check(typed_add_with_configs(), x, x)
  assert not report.failures and report.status == "not checked", report
  assert report.not_checked.startswith("no kernel ran: the program ran on cpu"), report.not_checked


def test_without_a_gpu_a_program_lowered_for_cuda_holds_the_default_config_said_at_the_lowering(
    isolated_disk_cache, monkeypatch):
  monkeypatch.delenv(autotuning.CPU_ENV, raising=False)
  call = typed_add_with_configs()
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  traced = jax.jit(call).trace(x, x)  # nothing chosen yet
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    line = sys._getframe().f_lineno + 1
    (cc,) = custom_calls(traced.lower(lowering_platforms=("cuda",)))
  (warning,) = [w for w in caught if w.category is autotuning.AutotuneSkipped]
  assert (warning.filename, warning.lineno) == (__file__, line) and "config 1 {'block': 128}" in str(warning.message)
  assert cc["config"]["block"] == [128, 1, 1] and cc["config"]["grid"] == [8, 1, 1]
  # vmapped, and exported for both: the kernel (one launch per element) for CUDA, the fallback for the CPU.
  batch = jax.ShapeDtypeStruct((3, 1000), jnp.float32)
  (cc,) = custom_calls(jax.jit(jax.vmap(call)).trace(batch, batch).lower(lowering_platforms=("cuda",)))
  assert cc["config"]["batch_size"] == 3 and cc["config"]["block"] == [128, 1, 1]
  exported = jax.export.export(jax.jit(call), platforms=["cuda", "cpu"])(x, x)
  y = np.arange(1000, dtype=np.float32)
  np.testing.assert_array_equal(np.asarray(exported.call(y, y)), 2 * y)


def test_without_a_gpu_a_fallback_that_disagrees_with_the_config_is_named_at_the_cuda_lowering(
    isolated_disk_cache, monkeypatch):
  monkeypatch.delenv(autotuning.CPU_ENV, raising=False)
  call = typed_add_with_configs(fallback=lambda x, y: (x + y).astype(jnp.float16))
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  said = (r"mosaic_kernel 'add' at test_autotune_untimed.py:\d+ .*: its fallback returns \(float16\[1000\]\) but the "
          r"kernel's out_shape is \(float32\[1000\]\)")
  with pytest.warns(autotuning.AutotuneSkipped), pytest.raises(jmf.LaunchError, match=said):
    jax.jit(call).trace(x, x).lower(lowering_platforms=("cuda",))


def test_without_a_gpu_an_autotuned_triton_kernel_with_a_fallback_builds_and_says_nothing(isolated_disk_cache,
                                                                                           monkeypatch):
  # @triton.autotune with fallback= is configs= with a fallback: the same silence where nothing can be timed,
  # through mosaic_kernel and triton_call alike; a program lowered for CUDA holds the first config, said there.
  monkeypatch.delenv(autotuning.CPU_ENV, raising=False)
  import triton_required
  triton_required.import_triton()
  import triton_decorated_sources as ds  # scaled_copy: 1000 elements leave two configs to time
  call = jmf.mosaic_kernel(jmf.triton_kernel(ds.scaled_copy), lambda x: x,
                           grid=lambda meta, x: jmf.cdiv(x.size, meta["BLOCK"]),
                           scalars=lambda meta, x: (np.int32(x.size), np.float32(2.5)), fallback=lambda x: 2.5 * x)

  def through_triton_call(x):
    return jmf.triton_call(x, n=x.size, factor=2.5, kernel=ds.scaled_copy, out_type=jax.typeof(x),
                           grid=lambda meta: jmf.cdiv(x.size, meta["BLOCK"]), fallback=lambda x, n, factor: factor * x)

  x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
  for fn in (call, through_triton_call):
    before, reports = stats(), len(jmf.autotune_report())
    with warnings.catch_warnings():
      warnings.simplefilter("error")
      np.testing.assert_allclose(np.asarray(jax.jit(fn)(x)), 2.5 * x, rtol=1e-6)
      np.testing.assert_allclose(np.asarray(jax.jit(jax.vmap(fn))(np.stack([x, x]))), 2.5 * np.stack([x, x]),
                                 rtol=1e-6)
    after = stats()
    assert after.compiles["triton"] == before.compiles["triton"] and after.autotune_skipped == before.autotune_skipped
    assert len(jmf.autotune_report()) == reports
    with pytest.warns(autotuning.AutotuneSkipped, match="config 0"):
      traced = jax.jit(fn).trace(jax.ShapeDtypeStruct(x.shape, x.dtype))
      (cc,) = custom_calls(traced.lower(lowering_platforms=("cuda",)))
    assert cc["config"]["grid"] == [8, 1, 1] and cc["config"]["block"] == [64, 1, 1]  # BLOCK 128, num_warps 2
