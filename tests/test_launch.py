"""Launching kernels on a GPU: dimensions, dtypes, scalars, outputs, shared memory.

Inputs are fresh random arrays; outputs are poisoned (conftest.py) so an
element a kernel did not write cannot match the reference.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ml_dtypes

import jax_mosaic_ffi as jmf

import kernel_sources

pytestmark = pytest.mark.gpu


def f32(rng, *shape):
  return rng.standard_normal(shape).astype(np.float32)


def test_elementwise_add(rng, isolated_disk_cache):
  n = 100_003
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), jnp.float32), grid=(n + 255) // 256,
                          block=256, scalars=(np.int32(n),))
  a, b = f32(rng, n), f32(rng, n)
  np.testing.assert_array_equal(np.asarray(jax.jit(add)(a, b)), a + b)


def test_reduction(rng, isolated_disk_cache):
  n, block = 1 << 20, 256
  kernel = jmf.cuda_kernel(kernel_sources.SUM, "block_sum")
  partial = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n // block,), jnp.float32), grid=n // block,
                              block=block, scalars=(np.int32(n),))
  x = f32(rng, n)
  total = jax.jit(lambda x: partial(x).sum())(x)
  np.testing.assert_allclose(float(total), x.astype(np.float64).sum(), rtol=1e-4, atol=1e-2)


def test_several_outputs(rng, isolated_disk_cache):
  n = 4096
  kernel = jmf.cuda_kernel(kernel_sources.SUM_AND_PRODUCT, "sum_and_product")
  out = jax.ShapeDtypeStruct((n,), jnp.float32)
  call = jmf.mosaic_kernel(kernel, (out, out), grid=n // 128, block=128, scalars=(np.int32(n),))
  a, b = f32(rng, n), f32(rng, n)
  s, p = jax.jit(call)(a, b)
  np.testing.assert_array_equal(np.asarray(s), a + b)
  np.testing.assert_array_equal(np.asarray(p), a * b)


@pytest.mark.parametrize("ctype, dtype", [
    ("float", np.float32), ("double", np.float64), ("__half", np.float16),
    ("__nv_bfloat16", ml_dtypes.bfloat16), ("int", np.int32), ("signed char", np.int8),
    ("unsigned char", np.uint8), ("long long", np.int64)])
def test_dtypes_through_a_cpp_template(rng, isolated_disk_cache, ctype, dtype):
  kernel = jmf.cuda_kernel(kernel_sources.AXPB, f"ops::axpb<{ctype}>")
  n = 5000
  with jax.enable_x64(dtype in (np.float64, np.int64)):
    call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((n,), dtype), grid=(n + 127) // 128, block=128,
                             scalars=(np.int64(n),))
    if np.issubdtype(dtype, np.integer):
      info = np.iinfo(dtype)
      x = rng.integers(max(info.min, -50), min(info.max, 50) // 2, size=n).astype(dtype)
    else:
      x = rng.standard_normal(n).astype(dtype)
    y = np.asarray(jax.jit(call)(x))
  expected = (x.astype(np.float32) * 2 + 1).astype(dtype)
  np.testing.assert_array_equal(y, expected)


SCALARS = r'''
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void scalars(double* out, signed char a, short b, int c, long long d,
                                   unsigned char e, unsigned short f, unsigned int g, unsigned long long h,
                                   __half i, __nv_bfloat16 j, float k, double l, bool m) {
  out[0] = a; out[1] = b; out[2] = c; out[3] = (double)d; out[4] = e; out[5] = f; out[6] = g;
  out[7] = (double)h; out[8] = __half2float(i); out[9] = __bfloat162float(j); out[10] = k; out[11] = l;
  out[12] = m ? 1.0 : 0.0;
}
'''


def test_scalars_of_every_supported_type(rng, isolated_disk_cache):
  kernel = jmf.cuda_kernel(SCALARS, "scalars")
  values = (np.int8(rng.integers(-128, 127)), np.int16(rng.integers(-3000, 3000)),
            np.int32(rng.integers(-2**31, 2**31 - 1)), np.int64(rng.integers(-2**40, 2**40)),
            np.uint8(rng.integers(0, 255)), np.uint16(rng.integers(0, 65535)),
            np.uint32(rng.integers(0, 2**32 - 1)), np.uint64(rng.integers(0, 2**40)),
            np.float16(rng.standard_normal()), ml_dtypes.bfloat16(rng.standard_normal()),
            np.float32(rng.standard_normal()), np.float64(rng.standard_normal()), True)
  with jax.enable_x64(True):
    call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((13,), jnp.float64), grid=1, block=1, scalars=values)
    out = np.asarray(jax.jit(call)())
  np.testing.assert_array_equal(out, np.array([float(v) for v in values]))


def test_zero_size_arrays_do_not_launch(isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.INCREMENT, "increment")
  before = jmf.kernel_cache_stats()
  inc = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((0,), jnp.float32), grid=1, block=1,
                          scalars=(np.int32(0),))
  out = jax.jit(inc)(jnp.zeros((0,), jnp.float32))
  assert out.shape == (0,)
  assert jmf.kernel_cache_stats().module_loads == before.module_loads


INDEX_3D = r'''
extern "C" __global__ void index3d(int* out, int nx, int ny, int nz) {
  int x = blockIdx.x * blockDim.x + threadIdx.x;
  int y = blockIdx.y * blockDim.y + threadIdx.y;
  int z = blockIdx.z * blockDim.z + threadIdx.z;
  if (x < nx && y < ny && z < nz) out[(z * ny + y) * nx + x] = (z * ny + y) * nx + x;
}
'''


@pytest.mark.parametrize("grid, block, shape", [
    ((3, 5), (32, 8), (1, 40, 96)),
    ((2, 3, 4), (16, 4, 2), (8, 12, 32)),
])
def test_2d_and_3d_grids_and_blocks(isolated_disk_cache, grid, block, shape):
  kernel = jmf.cuda_kernel(INDEX_3D, "index3d")
  nz, ny, nx = shape
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct(shape, jnp.int32), grid=grid, block=block,
                           scalars=(np.int32(nx), np.int32(ny), np.int32(nz)))
  np.testing.assert_array_equal(np.asarray(jax.jit(call)()), np.arange(nx * ny * nz).reshape(shape))


def test_dynamic_shared_memory_above_48_kib(rng, isolated_disk_cache):
  per_block = 48 * 1024  # 192 KiB of floats
  blocks = 8
  kernel = jmf.cuda_kernel(kernel_sources.BIG_SMEM, "reverse_in_smem")
  call = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((blocks * per_block,), jnp.float32), grid=blocks,
                           block=512, smem_bytes=per_block * 4, scalars=(np.int32(per_block),))
  x = f32(rng, blocks * per_block)
  expected = x.reshape(blocks, per_block)[:, ::-1].reshape(-1)
  np.testing.assert_array_equal(np.asarray(jax.jit(call)(x)), expected)


def test_one_shape_generic_wrapper_runs_every_shape(rng, isolated_disk_cache):
  kernel = jmf.cuda_kernel(kernel_sources.ADD, "add")
  add = jmf.mosaic_kernel(kernel, lambda a, b: jax.ShapeDtypeStruct(a.shape, a.dtype),
                          grid=lambda a, b: jmf.cdiv(a.size, 256), block=256,
                          scalars=lambda a, b: (np.int32(a.size),))
  f = jax.jit(add)
  for n in (1, 255, 4097, 100_003):
    a, b = f32(rng, n), f32(rng, n)
    np.testing.assert_array_equal(np.asarray(f(a, b)), a + b)


HISTOGRAM = r'''
extern "C" __global__ void histogram(const int* values, unsigned int* counts, int n, int bins) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&counts[values[i] % bins], 1u);
}'''


def test_zero_outputs_lets_a_kernel_accumulate(rng, isolated_disk_cache):
  n, bins = 1 << 18, 1000
  call = jax.jit(jmf.mosaic_kernel(jmf.cuda_kernel(HISTOGRAM, "histogram"), jax.ShapeDtypeStruct((bins,), jnp.uint32),
                                   grid=64, block=256, scalars=(np.int32(n), np.int32(bins)), zero_outputs=(0,)))
  for _ in range(3):  # poisoned (conftest) and reused: only the runtime's zeroing makes each count right
    values = rng.integers(0, 1 << 30, n, dtype=np.int32)
    np.testing.assert_array_equal(np.asarray(call(values)), np.bincount(values % bins, minlength=bins))
