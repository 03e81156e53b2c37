"""JAX transformations of mosaic_kernel: vmap and gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf

import kernel_sources
from hlo_inspect import custom_calls


@pytest.fixture
def add_kernel(isolated_disk_cache):
  return jmf.cuda_kernel(kernel_sources.ADD, "add")


def test_vmap_runs_the_kernel_once_per_element(add_kernel):
  x = jax.ShapeDtypeStruct((5, 32), jnp.float32)
  one = jax.ShapeDtypeStruct((32,), jnp.float32)
  call = jmf.mosaic_kernel(add_kernel, one, grid=1, block=32, scalars=(np.int32(32),))
  lowered = jax.jit(jax.vmap(call)).trace(x, x).lower(lowering_platforms=("cuda",))
  assert lowered.out_info.shape == (5, 32)
  assert len(custom_calls(lowered)) == 1  # inside the loop body
  assert "stablehlo.while" in lowered.as_text()


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
