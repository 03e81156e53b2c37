"""jax.export with shape polymorphism: what is supported, and the message for what is not.

Launch values (grid, block, scalars, shared memory) are fixed when the call is
lowered, before jax.export's symbolic sizes are known; so a call exports with
symbolic shapes when its launch does not depend on them (a grid-stride loop
over a fixed grid, the size read from an input array) and its out_shape may
use them (jax refines the custom call's result shapes when the export is
called). A launch value that depends on a symbolic dimension is refused,
naming the call site, the kernel and the value.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf

SCALE_ADD = r'''
extern "C" __global__ void scale_add(const float* x, const float* y, const int* n, float* out) {
  int count = *n;  // the size, from an input array: the grid does not depend on it
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
    out[i] = 2.0f * x[i] + y[i];
  }
}
'''
ADD = r'''
extern "C" __global__ void add(const float* a, const float* b, float* out, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}
'''


def scale_add():
  kernel = jmf.cuda_kernel(SCALE_ADD, "scale_add")
  call = jmf.mosaic_kernel(kernel, lambda x, y, n: jax.ShapeDtypeStruct(x.shape, x.dtype), grid=132, block=256,
                           fallback=lambda x, y, n: 2 * x + y)

  def f(x, y):
    return call(x, y, jnp.asarray(x.shape[0], jnp.int32).reshape(1))
  return f


def symbolic_export(f, platforms):
  (n,) = jax.export.symbolic_shape("n")
  spec = jax.ShapeDtypeStruct((n,), jnp.float32)
  return jax.export.export(jax.jit(f), platforms=platforms, disabled_checks=jmf.export_disabled_checks())(spec, spec)


def test_a_launch_independent_of_the_symbolic_size_exports_and_runs_at_any_size(isolated_disk_cache):
  exported = symbolic_export(scale_add(), ("cuda", "cpu"))
  assert [str(a) for a in exported.out_avals] == ["float32[n]"]
  text = exported.mlir_module()
  # The custom call's result shape is symbolic, given as a shape operand for jax to refine at call time.
  (call,) = re.findall(r"stablehlo.custom_call @jax_mosaic_ffi_launch\w*\(.*", text)
  assert "indices_of_shape_operands" in call and "-> tensor<?xf32>" in call
  assert "grid = array<i32: 132, 1, 1>" in call
  restored = jax.export.deserialize(exported.serialize())
  rng = np.random.default_rng()
  for size in (7, 3000):  # on the CPU, the same artifact runs its fallback at both sizes
    x, y = rng.standard_normal(size, np.float32), rng.standard_normal(size, np.float32)
    np.testing.assert_allclose(np.asarray(restored.call(x, y)), 2 * x + y, rtol=1e-6)


REFUSAL = ("mosaic_kernel 'add' at test_symbolic_shapes.py:{line} (<lambda>): {what} depends on a symbolic "
           "dimension of the inputs (in0 float32[n]; in1 float32[n]). Launch values are fixed when the call is "
           "lowered, and jax.export with shape polymorphism only knows those sizes when the exported function is "
           "called. Export once per concrete size, or make {what} independent of the symbolic dimensions: e.g. a "
           "fixed grid with a grid-stride loop, the size read inside the kernel from an input array (pass "
           "jnp.asarray(x.shape[0], jnp.int32).reshape(1)) rather than a scalar. out_shape may use symbolic "
           "dimensions")


def add_call(**launch):
  kernel = jmf.cuda_kernel(ADD, "add")
  return jmf.mosaic_kernel(kernel, lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype), **launch)


@pytest.mark.parametrize("what", ["grid", "scalars", "smem_bytes", "block"])
def test_a_launch_value_that_depends_on_a_symbolic_size_is_refused(isolated_disk_cache, what):
  launch = dict(grid=4, block=256, scalars=(np.int32(1000),))
  # One raises on the symbolic size (np.int32, cdiv), the others return it.
  launch[what] = {"grid": lambda x, y: jmf.cdiv(x.shape[0], 256), "scalars": lambda x, y: (np.int32(x.size),),
                  "smem_bytes": lambda x, y: 4 * x.shape[0], "block": lambda x, y: (x.shape[0] // 8,)}[what]
  call = add_call(**launch)
  with pytest.raises(jmf.LaunchError) as caught:
    symbolic_export(lambda x, y: call(x, y), ("cuda",))
  message = str(caught.value)
  site = re.match(r"mosaic_kernel 'add' at test_symbolic_shapes.py:(\d+) \(<lambda>\)", message)
  assert site is not None, message
  assert message == REFUSAL.format(line=site.group(1), what=what)
  # The line named is the user's call, in this file.
  source = open(__file__).read().splitlines()[int(site.group(1)) - 1]
  assert "symbolic_export(lambda x, y: call(x, y)" in source


def test_concrete_shapes_still_lower_as_before(isolated_disk_cache):
  call = add_call(grid=lambda x, y: jmf.cdiv(x.shape[0], 256), block=256, scalars=lambda x, y: (np.int32(x.size),))
  spec = jax.ShapeDtypeStruct((1000,), jnp.float32)
  text = jax.jit(call).trace(spec, spec).lower(lowering_platforms=("cuda",)).as_text()
  assert "grid = array<i32: 4, 1, 1>" in text and "indices_of_shape_operands" not in text


@pytest.mark.gpu
def test_a_deserialized_symbolic_export_runs_on_the_gpu_at_two_sizes(rng, isolated_disk_cache):
  restored = jax.export.deserialize(symbolic_export(scale_add(), ("cuda",)).serialize())
  for size in (1000, 1 << 20):  # fewer and more elements than the fixed grid's threads (132 x 256)
    x, y = rng.standard_normal(size, np.float32), rng.standard_normal(size, np.float32)
    out = restored.call(x, y)  # outputs are poisoned first (conftest): an unwritten element is NaN
    assert out.shape == (size,)
    np.testing.assert_allclose(np.asarray(out), 2 * x + y, rtol=1e-6, atol=1e-6)


def test_a_triton_launch_that_depends_on_a_symbolic_size_is_refused(isolated_disk_cache):
  pytest.importorskip("triton")
  import triton_sources as ts
  call = jmf.mosaic_kernel(jmf.triton_kernel(ts.add, constexprs={"BLOCK": 256}),
                           lambda x, y: jax.ShapeDtypeStruct(x.shape, x.dtype),
                           grid=lambda meta, x, y: jmf.cdiv(x.shape[0], meta["BLOCK"]),
                           scalars=lambda meta, x, y: (np.int32(x.size),))
  with pytest.raises(jmf.LaunchError) as caught:
    symbolic_export(lambda x, y: call(x, y), ("cuda",))
  site = re.match(r"mosaic_kernel 'add' at test_symbolic_shapes.py:(\d+) \(<lambda>\)", str(caught.value))
  assert site is not None, str(caught.value)
  assert str(caught.value) == REFUSAL.format(line=site.group(1), what="scalars")


def test_autotuning_on_symbolic_shapes_is_refused_where_it_would_time(isolated_disk_cache, monkeypatch):
  from jax_mosaic_ffi.transforms import autotune as autotuning
  monkeypatch.setenv(autotuning.CPU_ENV, "1")  # times here as it would on a GPU

  def factory(meta):
    return add_call(grid=4, block=meta["block"], scalars=(np.int32(1000),))
  tuned = jmf.autotune(factory, configs=[{"block": 128}, {"block": 256}], name="test-symbolic")
  with pytest.raises(jmf.AutotuneError) as caught:
    symbolic_export(tuned, ("cuda",))
  assert str(caught.value) == (
      "autotune 'test-symbolic': the inputs ['float32[n]', 'float32[n]'] have symbolic dimensions (jax.export "
      "with shape polymorphism), and configs can only be timed on concrete shapes. Pick the config first "
      "(tuned.best_config(*concrete_avals)) and export the call it makes (tuned.factory(config)), or export per "
      "concrete size")
