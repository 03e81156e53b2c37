"""The CPU path: mosaic_kernel(..., fallback=fn) runs a jax.numpy function off CUDA, and on CUDA in reference mode."""

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec as P

import jax_mosaic_ffi as jmf
from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.call import fallback
from jax_mosaic_ffi.call.primitive import mosaic_kernel_p

import fresh_process
import kernel_sources
from hlo_inspect import custom_calls

N = 256


@pytest.fixture
def add_kernel(isolated_disk_cache):
  return jmf.cuda_kernel(kernel_sources.ADD, "add")


def adder(kernel, fn=lambda a, b: a + b, **kwargs):
  return jmf.mosaic_kernel(kernel, out_shape=lambda a, b: a, grid=lambda a, b: jmf.cdiv(a.size, 128), block=128,
                           scalars=lambda a, b: (np.int32(a.size),), fallback=fn, **kwargs)


@pytest.fixture
def on_cpu():
  """The CPU backend, also on a machine with a GPU."""
  with jax.default_device(jax.devices("cpu")[0]):
    yield


def test_the_fallback_runs_on_the_cpu_under_jit_vmap_and_eagerly(add_kernel, rng, on_cpu):
  add = adder(add_kernel)
  a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: add(a, b) * 2)(a, b)), (a + b) * 2)
  np.testing.assert_array_equal(np.asarray(add(a, b)), a + b)  # outside jit: the primitive compiled alone
  batch = rng.standard_normal((3, N)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(add))(batch, batch)), batch + batch)


def test_several_outputs_and_in_place(rng, isolated_disk_cache, on_cpu):
  kernel = jmf.cuda_kernel(kernel_sources.SUM_AND_PRODUCT, "sum_and_product")
  x = jax.ShapeDtypeStruct((N,), jnp.float32)
  both = jmf.mosaic_kernel(kernel, (x, x), grid=2, block=128, scalars=(np.int32(N),),
                           fallback=lambda a, b: (a + b, a * b))
  a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
  s, p = jax.jit(both)(a, b)
  np.testing.assert_array_equal(np.asarray(s), a + b)
  np.testing.assert_array_equal(np.asarray(p), a * b)
  increment = jmf.mosaic_kernel(jmf.cuda_kernel(kernel_sources.INCREMENT, "increment"), x, grid=2, block=128,
                                scalars=(np.int32(N),), input_output_aliases={0: 0}, fallback=lambda v: v + 1)
  np.testing.assert_array_equal(np.asarray(jax.jit(increment, donate_argnums=0)(jnp.asarray(a))), a + 1)


def test_without_a_fallback_the_cpu_error_names_the_kernel_and_the_option(add_kernel):
  x = jax.ShapeDtypeStruct((8,), jnp.float32)
  call = jmf.mosaic_kernel(add_kernel, x, grid=1, block=8, scalars=(np.int32(8),))
  with pytest.raises(NotImplementedError, match=r"mosaic_kernel 'add' at .*fallback=fn"):
    jax.jit(call).trace(x, x).lower(lowering_platforms=("cpu",))


@pytest.mark.parametrize("fn, message", [
    (lambda a, b: (a + b).astype(jnp.float16), r"returns \(float16\[256\]\) but the kernel's out_shape is "
                                               r"\(float32\[256\]\)"),
    (lambda a, b: a[:8], r"returns \(float32\[8\]\)"),
    (lambda a, b: (a, b), r"returns \(float32\[256\], float32\[256\]\)"),
    (lambda a, b: a @ jnp.ones((3, 3)), r"its fallback raised TypeError"),
    (lambda a, b: {"sum": a + b}, r"must return an array like out_shape"),
])
def test_a_fallback_that_disagrees_with_the_kernel_is_refused_on_every_machine(add_kernel, fn, message):
  x = jax.ShapeDtypeStruct((N,), jnp.float32)
  with pytest.raises(jmf.LaunchError, match=message):
    jax.jit(adder(add_kernel, fn)).trace(x, x)


def test_the_fallback_must_be_a_function(add_kernel):
  with pytest.raises(TypeError, match="fallback must be a function"):
    adder(add_kernel, fn=np.zeros(3))


def export(fn, platforms):
  x = jax.ShapeDtypeStruct((N,), jnp.float32)
  return jax.export.export(jax.jit(fn), platforms=platforms, disabled_checks=jmf.export_disabled_checks())(x, x)


def test_export_for_cuda_never_lowers_the_fallback(add_kernel):
  exported = export(adder(add_kernel, lambda a, b: jnp.sin(a) + b), ["cuda"])
  text = exported.mlir_module()
  assert contract.LAUNCH_TARGET in text and "sine" not in text


def test_export_for_cuda_and_cpu_runs_the_fallback_on_the_cpu(add_kernel, rng, on_cpu):
  exported = export(adder(add_kernel, lambda a, b: jnp.sin(a) + b), ["cuda", "cpu"])
  text = exported.mlir_module()
  assert contract.LAUNCH_TARGET in text and "sine" in text
  a, b = (rng.standard_normal(N).astype(np.float32) for _ in range(2))
  again = jax.export.deserialize(exported.serialize())
  np.testing.assert_allclose(np.asarray(again.call(a, b)), np.sin(a) + b, rtol=1e-6, atol=1e-6)


def test_reference_mode_lowers_the_fallback_for_cuda(add_kernel, monkeypatch):
  x = jax.ShapeDtypeStruct((N,), jnp.float32)
  call = adder(add_kernel, lambda a, b: jnp.sin(a) + b)
  lower = lambda: jax.jit(lambda a, b: call(a, b)).trace(x, x).lower(lowering_platforms=("cuda",))  # noqa: E731
  assert len(custom_calls(lower())) == 1
  monkeypatch.setenv(fallback.REFERENCE_ENV, "1")
  lowered = lower()
  assert custom_calls(lowered) == [] and "sine" in lowered.as_text()


def test_reference_mode_warns_about_a_kernel_without_a_fallback(add_kernel, monkeypatch):
  monkeypatch.setenv(fallback.REFERENCE_ENV, "1")
  x = jax.ShapeDtypeStruct((8,), jnp.float32)
  call = jmf.mosaic_kernel(add_kernel, x, grid=1, block=8, scalars=(np.int32(8),))
  with pytest.warns(UserWarning, match="mosaic_kernel 'add' at .* has no fallback"):
    lowered = jax.jit(lambda a, b: call(a, b)).trace(x, x).lower(lowering_platforms=("cuda",))
  assert len(custom_calls(lowered)) == 1


def test_a_collective_kernel_falls_back_to_lax_collectives(rng, isolated_disk_cache, on_cpu):
  devices = jax.devices("cpu")
  if len(devices) < 8:
    pytest.skip("needs --xla_force_host_platform_device_count=8 before jax starts")
  mesh = Mesh(np.array(devices[:8]), ("x",))

  def all_reduce(x):
    call = jmf.mosaic_kernel(jmf.ops.collectives.kernel("all_reduce_f32"), jax.ShapeDtypeStruct(x.shape, x.dtype),
                             grid=1, block=256, scalars=(np.int64(x.size),), collective=jmf.Collective("x"),
                             fallback=lambda v: jax.lax.psum(v, "x"))
    return call(x)

  f = jax.jit(jax.shard_map(all_reduce, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
  x = rng.standard_normal(8 * 64).astype(np.float32)
  expected = np.tile(x.reshape(8, 64).sum(0), 8)
  np.testing.assert_allclose(np.asarray(f(x)), expected, rtol=1e-5, atol=1e-5)


def test_a_primitive_rebound_on_batched_operands_needs_its_fallback_vmapped(add_kernel):
  # What a batching rule that launches one kernel over the whole batch does with the fallback.
  x = jax.ShapeDtypeStruct((N,), jnp.float32)
  (eqn,) = jax.make_jaxpr(adder(add_kernel, lambda a, b: (a + b).reshape(a.size)))(x, x).eqns
  spec, batched = eqn.params["spec"], jax.ShapeDtypeStruct((3, N), jnp.float32)

  def lower(fb):
    bind = lambda a, b: mosaic_kernel_p.bind(  # noqa: E731
        a, b, kernel=eqn.params["kernel"], out_avals=(jax.core.ShapedArray(batched.shape, batched.dtype),),
        spec=dataclasses.replace(spec, fallback=fb))
    return jax.jit(bind).trace(batched, batched).lower(lowering_platforms=("cpu",))

  with pytest.raises(jmf.LaunchError, match="must adapt its fallback"):
    lower(spec.fallback)
  assert "add" in lower(spec.fallback.vmapped(0)).as_text()


# ---------------------------------------------------------------- on a GPU

@pytest.mark.gpu
def test_default_device_cpu_runs_the_fallback_and_agrees_with_the_kernel(add_kernel, rng):
  add = adder(add_kernel)
  a, b = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
  on_gpu = jax.jit(lambda a, b: add(a, b))(a, b)
  assert on_gpu.devices() == {jax.devices("cuda")[0]}
  cpu = jax.devices("cpu")[0]
  with jax.default_device(cpu):
    on_cpu = jax.jit(lambda a, b: add(a, b))(a, b)
  assert on_cpu.devices() == {cpu}
  np.testing.assert_array_equal(np.asarray(on_gpu), a + b)
  np.testing.assert_array_equal(np.asarray(on_cpu), a + b)


@pytest.mark.gpu
def test_reference_mode_runs_the_fallback_on_the_gpu(add_kernel, rng, monkeypatch):
  # A fallback that differs on purpose, to see which one ran.
  add = adder(add_kernel, lambda a, b: a + b + 1)
  a, b = (rng.standard_normal(1000).astype(np.float32) for _ in range(2))
  np.testing.assert_array_equal(np.asarray(jax.jit(lambda a, b: add(a, b))(a, b)), a + b)
  monkeypatch.setenv(fallback.REFERENCE_ENV, "1")
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = jax.jit(lambda a, b: add(a, b))(a, b)
  assert not [w for w in caught if fallback.REFERENCE_ENV in str(w.message)]  # it has a fallback: no warning
  assert out.devices() == {jax.devices("cuda")[0]}
  np.testing.assert_allclose(np.asarray(out), a + b + 1, rtol=1e-6, atol=1e-6)


def test_nothing_of_ours_waits_for_the_cycle_collector(isolated_disk_cache):
  # A call with a fallback, jitted, vmapped and autotuned, then dropped: with the cycle collector off, whatever of
  # this package the calls made must go with them (an object in a reference cycle keeps what it holds, a
  # kernel call and its executables, until a collection).
  script = """
      import gc, json, types
      import jax, numpy as np
      import jax_mosaic_ffi as jmf, kernel_sources
      from test_autotune import add_factory
      x = np.arange(1000, dtype=np.float32)
      kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
      gc.collect()
      gc.disable()

      def use():
        call = jmf.mosaic_kernel(kernel, lambda a, b: jax.ShapeDtypeStruct(a.shape, a.dtype),
                                 grid=lambda a, b: jmf.cdiv(a.size, 256), block=256,
                                 scalars=lambda a, b: (np.int32(a.size),), fallback=lambda a, b: a + b)
        ok = bool((np.asarray(jax.jit(call)(x, x)) == 2 * x).all())
        ok &= bool((np.asarray(jax.jit(jax.vmap(jax.vmap(call)))(x.reshape(2, 5, 100), x.reshape(2, 5, 100)))
                    == 2 * x.reshape(2, 5, 100)).all())
        tuned = jmf.autotune(add_factory, configs=[{"block": 128, "work": 1}, {"block": 256, "work": 0}])
        ok &= bool((np.asarray(jax.jit(tuned)(x, x)) == 2 * x).all())
        return ok

      ok = use()
      jax.clear_caches()
      gc.set_debug(gc.DEBUG_SAVEALL)
      gc.collect()
      ours = set()
      for o in gc.garbage:
        module = getattr(o, "__module__", None) if isinstance(o, types.FunctionType) else type(o).__module__
        if isinstance(module, str) and module.startswith("jax_mosaic_ffi"):
          ours.add(f"{module}.{getattr(o, '__qualname__', type(o).__qualname__)}")
      print(json.dumps({"ok": ok, "ours": sorted(ours)}))
  """
  result = fresh_process.run(script, env={"JAX_MOSAIC_FFI_CACHE_DIR": str(isolated_disk_cache),
                                                       "JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU": "1"}).result
  assert result == {"ok": True, "ours": []}, result
