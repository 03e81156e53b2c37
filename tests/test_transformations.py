"""JAX transformations of mosaic_kernel: vmap and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf

import fresh_process
import kernel_sources
from hlo_inspect import custom_calls


# Written for batch_grid_axis="y": blockIdx.y is the batch element.
BATCHED_SCALE = r'''
extern "C" __global__ void batched_scale(const float* x, float* y, float factor, int n,
                                         unsigned int grid_per_element, unsigned long long x_stride,
                                         unsigned long long y_stride) {
  const unsigned int element = blockIdx.y / grid_per_element;
  x = (const float*)((const char*)x + element * x_stride);
  y = (float*)((char*)y + element * y_stride);
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * factor;
}
'''


@pytest.fixture
def add_kernel(isolated_disk_cache):
  return jmf.cuda_kernel(kernel_sources.ADD, "add")


def batched_config(fn, *avals):
  lowered = jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",))
  (cc,) = custom_calls(lowered)  # one custom call: no loop around it
  assert "stablehlo.while" not in lowered.as_text()
  return cc["config"], lowered.out_info


def add_call(kernel):
  return jmf.mosaic_kernel(kernel, lambda a, b: a, grid=lambda a, b: jmf.cdiv(a.size, 256), block=256,
                           scalars=lambda a, b: (np.int32(a.size),))


def test_vmap_is_one_call_with_a_launch_per_element(add_kernel):
  x, y = jax.ShapeDtypeStruct((5, 300), jnp.float32), jax.ShapeDtypeStruct((300,), jnp.float32)
  config, out = batched_config(jax.vmap(add_call(add_kernel), in_axes=(0, None)), x, y)
  assert config["batch_size"] == 5
  assert config["batch_strides"] == [1200, 0, 1200]  # y is shared by every element
  assert config["grid"] == [2, 1, 1] and config["scalar_data"][:4] == np.int32(300).tobytes()  # per element
  assert out.shape == (5, 300)


def test_nested_vmap_merges_into_one_batch(add_kernel):
  call = add_call(add_kernel)
  x, y = jax.ShapeDtypeStruct((3, 5, 300), jnp.float32), jax.ShapeDtypeStruct((300,), jnp.float32)
  config, out = batched_config(jax.vmap(jax.vmap(call, in_axes=(0, None)), in_axes=(0, None)), x, y)
  assert (config["batch_size"], config["batch_strides"], out.shape) == (15, [1200, 0, 1200], (3, 5, 300))
  # An input batched at one level only is broadcast, so every element sits one stride on.
  a, b = jax.ShapeDtypeStruct((5, 300), jnp.float32), jax.ShapeDtypeStruct((3, 300), jnp.float32)
  config, out = batched_config(jax.vmap(jax.vmap(call, in_axes=(0, None)), in_axes=(None, 0)), a, b)
  assert (config["batch_size"], config["batch_strides"], out.shape) == (15, [1200, 1200, 1200], (3, 5, 300))


def test_vmap_batches_an_aliased_input_it_would_otherwise_share(add_kernel):
  # out = a + b written over b: each element needs its own b to write to.
  call = jmf.mosaic_kernel(add_kernel, lambda a, b: a, grid=lambda a, b: jmf.cdiv(a.size, 256), block=256,
                           scalars=lambda a, b: (np.int32(a.size),), input_output_aliases={1: 0})
  a, b = jax.ShapeDtypeStruct((4, 256), jnp.float32), jax.ShapeDtypeStruct((256,), jnp.float32)
  config, out = batched_config(jax.vmap(call, in_axes=(0, None)), a, b)
  assert config["batch_size"] == 4 and config["batch_strides"] == [1024, 1024, 1024] and out.shape == (4, 256)


def test_a_batch_on_a_grid_axis_is_one_longer_launch(isolated_disk_cache):
  kernel = jmf.cuda_kernel(BATCHED_SCALE, "batched_scale")
  call = jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: (jmf.cdiv(x.size, 256), 1, 1), block=256,
                           scalars=lambda x: (np.float32(3.0), np.int32(x.size)), batch_grid_axis="y")
  x = jax.ShapeDtypeStruct((7, 1000), jnp.float32)
  config, _ = batched_config(jax.vmap(call), x)
  assert "batch_size" not in config and config["grid"] == [4, 7, 1]
  assert config["scalar_sizes"] == [4, 4, 4, 8, 8]  # factor, n, then the element's grid length and strides
  assert config["scalar_data"][16:20] == np.uint32(1).tobytes()
  assert config["scalar_data"][24:32] == np.uint64(4000).tobytes()
  unbatched, _ = batched_config(call, jax.ShapeDtypeStruct((1000,), jnp.float32))
  assert unbatched["grid"] == [4, 1, 1] and unbatched["scalar_data"][24:32] == bytes(8)


def test_a_grid_axis_kernel_must_take_the_batch_parameters(add_kernel):
  call = jmf.mosaic_kernel(add_kernel, lambda a, b: a, grid=4, block=256, scalars=(np.int32(1024),),
                           batch_grid_axis="z")
  x = jax.ShapeDtypeStruct((1024,), jnp.float32)
  with pytest.raises(jmf.LaunchError, match="then the batch parameters of batch_grid_axis"):
    jax.jit(call).trace(x, x)


def test_a_collective_kernel_cannot_be_vmapped(isolated_disk_cache):
  call = jmf.mosaic_kernel(jmf.ops.collectives.kernel("all_reduce_f32"), lambda x: x, grid=1, block=256,
                           scalars=lambda x: (np.int64(x.size),), collective=jmf.Collective("x"))
  with pytest.raises(jmf.LaunchError, match="cannot be vmapped"):
    jax.jit(jax.vmap(call)).trace(jax.ShapeDtypeStruct((2, 256), jnp.float32))


def test_grad_explains_how_to_differentiate(add_kernel):
  x = jnp.ones((8,), jnp.float32)
  call = jmf.mosaic_kernel(add_kernel, jax.ShapeDtypeStruct((8,), jnp.float32), grid=1, block=8,
                           scalars=(np.int32(8),))
  with pytest.raises(TypeError, match="jmf.differentiable"):
    jax.grad(lambda a: call(a, a).sum())(x)


SCALE = r'''
extern "C" __global__ void scale(const float* x, float* y, float factor, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * factor;
}
'''


@pytest.mark.gpu
def test_gradients_through_custom_vjp_and_vmap(rng, isolated_disk_cache):
  n = 4096
  kernel = jmf.cuda_kernel(SCALE, "scale")

  def scale_by(factor):
    return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=n // 256, block=256,
                             scalars=(np.float32(factor), np.int32(n)))

  @jax.custom_vjp
  def triple(x):
    return scale_by(3.0)(x)

  triple.defvjp(lambda x: (triple(x), None), lambda _, g: (scale_by(3.0)(g),))
  x = rng.standard_normal(n).astype(np.float32)
  grad = jax.jit(jax.grad(lambda v: (triple(v) ** 2).sum()))(x)
  np.testing.assert_allclose(np.asarray(grad), 18.0 * x, rtol=1e-5)
  batch = rng.standard_normal((3, n)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(triple))(batch)), batch * np.float32(3.0))


@pytest.mark.gpu
def test_vmap_runs_every_element_with_shared_and_batched_inputs(rng, add_kernel):
  call = add_call(add_kernel)
  a, b = rng.standard_normal((6, 1000)).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(call, in_axes=(0, None)))(a, b)), a + b)
  c = rng.standard_normal((3, 6, 1000)).astype(np.float32)
  nested = jax.jit(jax.vmap(jax.vmap(call, in_axes=(0, None)), in_axes=(0, None)))
  np.testing.assert_array_equal(np.asarray(nested(c, b)), c + b)
  d = rng.standard_normal((3, 1000)).astype(np.float32)
  crossed = jax.jit(jax.vmap(jax.vmap(call, in_axes=(0, None)), in_axes=(None, 0)))(a, d)
  np.testing.assert_array_equal(np.asarray(crossed), a[None] + d[:, None])


@pytest.mark.gpu
def test_vmap_of_an_in_place_update(rng, add_kernel):
  call = jmf.mosaic_kernel(add_kernel, lambda a, b: a, grid=lambda a, b: jmf.cdiv(a.size, 256), block=256,
                           scalars=lambda a, b: (np.int32(a.size),), input_output_aliases={1: 0})
  a, b = rng.standard_normal((4, 777)).astype(np.float32), rng.standard_normal(777).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(call, in_axes=(0, None)))(a, b)), a + b)


@pytest.mark.gpu
def test_a_batch_on_a_grid_axis_runs_as_one_launch(rng, isolated_disk_cache):
  kernel = jmf.cuda_kernel(BATCHED_SCALE, "batched_scale")
  call = jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: (jmf.cdiv(x.size, 256), 1, 1), block=256,
                           scalars=lambda x: (np.float32(3.0), np.int32(x.size)), batch_grid_axis="y")
  x = rng.standard_normal((7, 1000)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(call))(x)), x * np.float32(3.0))
  np.testing.assert_array_equal(np.asarray(jax.jit(call)(x[2])), x[2] * np.float32(3.0))
  z = rng.standard_normal((2, 3, 1000)).astype(np.float32)
  np.testing.assert_array_equal(np.asarray(jax.jit(jax.vmap(jax.vmap(call)))(z)), z * np.float32(3.0))


BATCHED_CHAIN = '''
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    import jax_mosaic_ffi as jmf, kernel_sources
    kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
    add = jmf.mosaic_kernel(kernel, lambda a, b: a, grid=lambda a, b: jmf.cdiv(a.size, 256), block=256,
                            scalars=lambda a, b: (np.int32(a.size),))
    def chain(x, y):
      for _ in range(8):  # enough consecutive calls for a command buffer
        x = jax.vmap(add, in_axes=(0, None))(x, y)
      return x
    f = jax.jit(chain)
    rng = np.random.default_rng(int(sys.argv[2]))
    x = rng.standard_normal((int(sys.argv[1]), 4096)).astype(np.float32)
    y = rng.standard_normal(4096).astype(np.float32)
    outs = [np.asarray(f(x * k, y)) for k in (1, 2)]
    expected = []
    for k in (1, 2):
      e = x * np.float32(k)
      for _ in range(8):
        e = e + y  # float32, in the kernel's order
      expected.append(e)
    print(json.dumps({"wrong": int(sum((o != e).sum() for o, e in zip(outs, expected))),
                      "records": jmf.kernel_cache_stats().records_created}))
'''


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [4, 64], ids=["recorded", "captured"])
def test_a_vmapped_call_in_a_command_buffer(tmp_path, batch):
  result = fresh_process.run(BATCHED_CHAIN, batch, 5, cwd=tmp_path, env={
      "JAX_MOSAIC_FFI_POISON_OUTPUTS": "0", "JAX_MOSAIC_FFI_CACHE_DIR": str(tmp_path / "cache")}).result
  assert result["wrong"] == 0
  # Up to 15 elements, every launch is a node of its own; more are captured from the stream.
  assert result["records"] == (8 * batch if batch <= 14 else 0)
