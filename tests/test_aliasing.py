"""In-place updates: input/output aliases, one pointer per aliased pair, and donation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf

import kernel_sources
from hlo_inspect import custom_calls

# One pointer per updated buffer, as real optimizers take them.
SGD_MOMENTUM = r'''
extern "C" __global__ void sgd_momentum(float* param, float* velocity, const float* grad, float lr,
                                        float momentum, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = momentum * velocity[i] + grad[i];
    velocity[i] = v;
    param[i] -= lr * v;
  }
}
'''


def sgd_call(kernel, n, param_order):
  spec = jax.ShapeDtypeStruct((n,), jnp.float32)
  return jmf.mosaic_kernel(kernel, (spec, spec), grid=jmf.cdiv(n, 256), block=256,
                           scalars=(np.float32(0.1), np.float32(0.9), np.int32(n)),
                           input_output_aliases={0: 0, 1: 1}, param_order=param_order)


def test_aliases_become_operand_output_aliases(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  x = jax.ShapeDtypeStruct((256,), jnp.float32)
  call = jmf.mosaic_kernel(kernel, x, grid=1, block=256, scalars=(np.int32(256),), input_output_aliases={1: 0})
  text = jax.jit(call).trace(x, x).lower(lowering_platforms=("cuda",)).as_text()
  assert "output_operand_aliases" in text and "operand_index = 1" in text


def test_one_pointer_per_aliased_pair_lowers_to_those_buffers_only(isolated_disk_cache):
  kernel = jmf.cuda_kernel(SGD_MOMENTUM, "sgd_momentum")
  assert kernel.param_sizes == (8, 8, 8, 4, 4, 4)
  x = jax.ShapeDtypeStruct((1000,), jnp.float32)
  call = sgd_call(kernel, 1000, ("in0", "in1", "in2", "scalar0", "scalar1", "scalar2"))
  (cc,) = custom_calls(jax.jit(call).trace(x, x, x).lower(lowering_platforms=("cuda",)))
  assert cc["config"]["param_order"] == [0, 1, 2, -1, -2, -3]
  assert (cc["config"]["num_inputs"], cc["config"]["num_outputs"]) == (3, 2)


@pytest.mark.gpu
def test_in_place_update_through_aliases(rng, isolated_disk_cache):
  n = 1 << 16
  kernel = jmf.cuda_kernel(kernel_sources.INCREMENT, "increment")
  inc = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=n // 256, block=256,
                          scalars=(np.int32(n),), input_output_aliases={0: 0})
  x = rng.standard_normal(n).astype(np.float32)
  y = jax.jit(inc, donate_argnums=0)(jnp.asarray(x))
  np.testing.assert_array_equal(np.asarray(y), x + 1)
  z = jax.jit(lambda v: inc(inc(inc(v))))(x)
  np.testing.assert_array_equal(np.asarray(z), ((x + 1) + 1) + 1)


@pytest.mark.gpu
@pytest.mark.parametrize("order", [("in0", "in1", "in2", "scalar0", "scalar1", "scalar2"),
                                   ("out0", "out1", "in2", "scalar0", "scalar1", "scalar2")])
def test_an_optimizer_step_through_one_pointer_per_buffer(rng, isolated_disk_cache, order):
  n = 50_000
  step = jax.jit(sgd_call(jmf.cuda_kernel(SGD_MOMENTUM, "sgd_momentum"), n, order))
  for _ in range(2):  # fresh inputs twice: no stale results
    host = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    p, v, g = (jax.device_put(a) for a in host)
    new_p, new_v = step(p, v, g)
    expected_v = np.float32(0.9) * host[1] + host[2]
    np.testing.assert_allclose(np.asarray(new_v), expected_v, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(new_p), host[0] - np.float32(0.1) * expected_v, rtol=1e-6, atol=1e-6)
    # Not donated: XLA gave the kernel copies, and the caller's device arrays,
    # read back after the call, still hold what they held before it.
    for before, after in zip(host, (p, v, g)):
      np.testing.assert_array_equal(np.asarray(after), before)


@pytest.mark.gpu
def test_a_donated_in_place_update_does_not_copy(rng, isolated_disk_cache):
  n = 1 << 20
  step = jax.jit(sgd_call(jmf.cuda_kernel(SGD_MOMENTUM, "sgd_momentum"), n,
                          ("in0", "in1", "in2", "scalar0", "scalar1", "scalar2")), donate_argnums=(0, 1))
  p, v, g = (jnp.asarray(rng.standard_normal(n).astype(np.float32)) for _ in range(3))
  p_host, v_host, g_host = np.asarray(p), np.asarray(v), np.asarray(g)
  addresses = (p.unsafe_buffer_pointer(), v.unsafe_buffer_pointer())
  new_p, new_v = step(p, v, g)
  # The outputs live where the donated inputs were: updated in place, nothing copied.
  assert (new_p.unsafe_buffer_pointer(), new_v.unsafe_buffer_pointer()) == addresses
  expected_v = np.float32(0.9) * v_host + g_host
  np.testing.assert_allclose(np.asarray(new_v), expected_v, rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(np.asarray(new_p), p_host - np.float32(0.1) * expected_v, rtol=1e-6, atol=1e-6)
