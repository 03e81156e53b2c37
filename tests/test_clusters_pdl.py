"""Thread-block clusters and programmatic dependent launch (PDL) on a GPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_mosaic_ffi as jmf


pytestmark = pytest.mark.gpu


def f32(rng, *shape):
  return rng.standard_normal(shape).astype(np.float32)


CLUSTER = r'''
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void __cluster_dims__(2, 1, 1) swap_in_cluster(const float* in, float* out) {
  __shared__ float mine[256];
  cg::cluster_group cluster = cg::this_cluster();
  mine[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
  cluster.sync();
  unsigned int other = cluster.block_rank() ^ 1;
  float* theirs = cluster.map_shared_rank(mine, other);
  out[blockIdx.x * 256 + threadIdx.x] = theirs[threadIdx.x];
  cluster.sync();
}
'''


def test_thread_block_cluster_with_distributed_shared_memory(rng, isolated_disk_cache):
  blocks = 16
  kernel = jmf.cuda_kernel(CLUSTER, "swap_in_cluster")
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((blocks * 256,), jnp.float32), grid=blocks, block=256,
                           cluster=(2, 1, 1))
  x = f32(rng, blocks * 256)
  expected = x.reshape(blocks // 2, 2, 256)[:, ::-1].reshape(-1)
  np.testing.assert_array_equal(np.asarray(jax.jit(call)(x)), expected)


PDL = r'''
extern "C" __global__ void produce(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * 3.0f;
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
extern "C" __global__ void consume(const float* y, float* z, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) z[i] = y[i] + 1.0f;
}
'''


def test_programmatic_dependent_launch_pair(rng, isolated_disk_cache):
  n = 1 << 20
  out = jax.ShapeDtypeStruct((n,), jnp.float32)
  produce = jmf.mosaic_kernel(jmf.cuda_kernel(PDL, "produce"), out, grid=n // 256, block=256,
                              scalars=(np.int32(n),))
  consume = jmf.mosaic_kernel(jmf.cuda_kernel(PDL, "consume"), out, grid=n // 256, block=256,
                              scalars=(np.int32(n),), uses_pdl=True)
  x = f32(rng, n)
  z = jax.jit(lambda x: consume(produce(x)))(x)
  np.testing.assert_array_equal(np.asarray(z), x * 3 + 1)
