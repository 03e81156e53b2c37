"""A memory-bound kernel through mosaic_kernel against a device-to-device copy.

Vector add over 1 GiB arrays (reads 2 GiB, writes 1 GiB per call), a chain
of calls in one jit, against cuMemcpyDtoD of 1 GiB timed with events in the
same process.
"""

import os
import sys

os.environ.setdefault("JAX_MOSAIC_FFI_POISON_OUTPUTS", "0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from cuda.bindings import driver  # noqa: E402

import jax_mosaic_ffi as jmf  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from common import check, emit, median_seconds  # noqa: E402

GIB = 1 << 30
N = GIB // 4
CHAIN = 10

SOURCE = r'''
extern "C" __global__ void vector_add(const float4* x, const float4* y, float4* out, long long n4) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 a = x[i], b = y[i];
    out[i] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
  }
}
'''


def main():
  kernel = jmf.cuda_kernel(SOURCE, "vector_add")
  n4 = N // 4
  add = jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((N,), jnp.float32), grid=n4 // 256, block=256,
                          scalars=(np.int64(n4),))

  def chain(x, y):
    for _ in range(CHAIN):
      x = add(x, y)
    return x

  key = jax.random.key(0)
  x = jax.random.normal(key, (N,), jnp.float32)
  y = jax.random.normal(jax.random.fold_in(key, 1), (N,), jnp.float32)
  f = jax.jit(chain)
  sample = np.asarray(f(x, y)[:1 << 20])
  np.testing.assert_allclose(sample, np.asarray(x[:1 << 20]) + CHAIN * np.asarray(y[:1 << 20]), rtol=1e-5, atol=1e-4)
  kernel_s = median_seconds(lambda: f(x, y).block_until_ready(), warmup=2, reps=10) / CHAIN
  kernel_bw = 3 * GIB / kernel_s

  check(driver.cuInit(0))
  context = check(driver.cuDevicePrimaryCtxRetain(check(driver.cuDeviceGet(0))))
  check(driver.cuCtxSetCurrent(context))
  src = x.unsafe_buffer_pointer()
  dst = y.unsafe_buffer_pointer()
  stream = check(driver.cuStreamCreate(1))
  start, stop = check(driver.cuEventCreate(0)), check(driver.cuEventCreate(0))
  times = []
  for _ in range(12):
    check(driver.cuEventRecord(start, stream))
    check(driver.cuMemcpyDtoDAsync(dst, src, GIB, stream))
    check(driver.cuEventRecord(stop, stream))
    check(driver.cuEventSynchronize(stop))
    times.append(check(driver.cuEventElapsedTime(start, stop)) / 1e3)
  copy_s = float(np.median(times[2:]))
  copy_bw = 2 * GIB / copy_s
  emit({"vector_add_ms": kernel_s * 1e3, "vector_add_GBps": kernel_bw / 1e9, "copy_ms": copy_s * 1e3,
        "copy_GBps": copy_bw / 1e9, "ratio": kernel_bw / copy_bw})


if __name__ == "__main__":
  main()
