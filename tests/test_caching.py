"""Nothing compiled or loaded twice, and nothing left behind (on a GPU)."""

import gc
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf

import fresh_process
import kernel_sources

pytestmark = pytest.mark.gpu


def f32(rng, *shape):
  return rng.standard_normal(shape).astype(np.float32)


def test_eight_call_sites_compile_once_and_a_new_jit_compiles_nothing(rng, isolated_disk_cache):
  n = 1024
  source = kernel_sources.ADD.replace("a[i] + b[i]", "a[i] + b[i] + 0.5f")  # a kernel no other test uses
  jmf.clear_kernel_cache()
  before = jmf.kernel_cache_stats()
  kernel = jmf.cuda_kernel(source, "add")
  add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=n // 256, block=256,
                          scalars=(np.int32(n),))

  def eight(a, b):
    for _ in range(8):
      a = add(a, b)
    return a

  a, b = f32(rng, n), f32(rng, n)
  out = jax.jit(eight)(a, b)
  expected = a.copy()
  for _ in range(8):
    expected = expected + b + 0.5
  np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-6, atol=1e-5)
  mid = jmf.kernel_cache_stats()
  assert mid.compiles["nvrtc"] - before.compiles["nvrtc"] == 1
  assert mid.module_parses - before.module_parses == 1
  assert mid.parse_cache_hits - before.parse_cache_hits == 7
  assert mid.module_loads - before.module_loads == 1

  again = jax.jit(lambda a, b: add(add(a, b), b))(a, b)
  np.testing.assert_allclose(np.asarray(again), a + 2 * b + 1.0, rtol=1e-6, atol=1e-5)
  after = jmf.kernel_cache_stats()
  assert after.compiles["nvrtc"] == mid.compiles["nvrtc"]
  assert after.module_parses == mid.module_parses
  assert after.module_loads == mid.module_loads


@pytest.mark.exclusive
def test_no_growth_over_200_compile_delete_clear_cycles(rng, isolated_disk_cache):
  from cuda.bindings import driver
  n = 4096
  x = f32(rng, n)

  def cycle(i):
    source = kernel_sources.INCREMENT.replace("+ 1.0f", f"+ {i}.0f")
    kernel = jmf.cuda_kernel(source, "increment")
    inc = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=n // 256, block=256,
                            scalars=(np.int32(n),))
    y = jax.jit(inc)(x)
    np.testing.assert_array_equal(np.asarray(y), x + i)
    del y, inc, kernel
    jax.clear_caches()
    jmf.clear_kernel_cache()

  def free_bytes():
    err, free, _ = driver.cuMemGetInfo()
    return free

  for i in range(5):  # warm up allocators and caches
    cycle(i)
  # Executables of earlier tests that only the cycle collector frees would unload during the loop.
  gc.collect()
  base_modules = jmf.kernel_cache_stats().loaded_modules
  base_free = free_bytes()
  for i in range(200):
    cycle(i + 5)
  gc.collect()
  stats = jmf.kernel_cache_stats()
  assert stats.loaded_modules == base_modules, stats
  assert stats.cached_kernels == 0
  assert base_free - free_bytes() < 64 << 20, (base_free, free_bytes())


def test_a_deleted_executable_unloads_its_module_without_the_cycle_collector(isolated_disk_cache):
  # With the cycle collector off: a jitted call (five in a row: a command buffer, recorded), its executable and
  # an autotuned call dropped, the modules they loaded are unloaded at once.
  script = """
      import gc, json
      import jax, jax.numpy as jnp, numpy as np
      import jax_mosaic_ffi as jmf, kernel_sources
      from test_autotune import add_factory
      x = np.arange(4096, dtype=np.float32)
      jmf.register()
      gc.collect()
      gc.disable()
      base = jmf.kernel_cache_stats().loaded_modules

      def use():
        source = kernel_sources.INCREMENT.replace("+ 1.0f", "+ 3.0f")  # a kernel of this process only
        inc = jmf.mosaic_kernel(jmf.cuda_kernel(source, "increment"), jax.ShapeDtypeStruct(x.shape, x.dtype),
                                grid=16, block=256, scalars=(np.int32(x.size),))
        f = jax.jit(lambda v: inc(inc(inc(inc(inc(v))))))
        compiled = f.lower(x).compile()
        ok = bool((np.asarray(compiled(x)) == x + 15).all()) and bool((np.asarray(f(x)) == x + 15).all())
        tuned = jmf.autotune(add_factory, configs=[{"block": 128, "work": 0}, {"block": 256, "work": 0}])
        ok &= bool((np.asarray(jax.jit(tuned)(x, x)) == 2 * x).all())
        return ok, jmf.kernel_cache_stats().loaded_modules

      ok, during = use()
      jax.clear_caches()  # jax's own caches of compiled programs: what remains is what references hold
      after = jmf.kernel_cache_stats().loaded_modules
      print(json.dumps({"ok": ok, "loaded": during - base, "left": after - base}))
  """
  result = fresh_process.run(script, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache)}).result
  assert result["ok"] and result["loaded"] >= 2, result
  assert result["left"] == 0, result


def test_compiles_are_counted_by_compiler_and_the_old_fields_still_read(isolated_disk_cache):
  before = jmf.kernel_cache_stats()
  assert {"nvrtc", "triton", "cute"} <= set(before.compiles)  # every installed front end's compiler, from 0
  jmf.cuda_kernel(kernel_sources.ADD, "add", targets="sm_90")
  after = jmf.kernel_cache_stats()
  assert after.compiles["nvrtc"] - before.compiles["nvrtc"] == 1
  assert (after.nvrtc_compiles, after.triton_compiles, after.cute_compiles) == (
      after.compiles["nvrtc"], after.compiles["triton"], after.compiles["cute"])
