"""A memory-bound kernel through mosaic_kernel against a device-to-device copy.

Vector add over 1 GiB arrays (reads 2 GiB, writes 1 GiB per call), a chain
of calls in one jit, against cuMemcpyDtoD of 1 GiB timed with events in the
same process.
"""

from __future__ import annotations

import statistics

from benchmarks import timing
from benchmarks.markdown import failure, fmt, table
from benchmarks.suite import Run

NAME = "bandwidth"
TITLE = "Memory-bound kernel"
ORDER = 20
RUNS = (Run("main"),)

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


def run() -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  n4 = N // 4
  add = jmf.mosaic_kernel(jmf.cuda_kernel(SOURCE, "vector_add"), jax.ShapeDtypeStruct((N,), jnp.float32),
                          grid=n4 // 256, block=256, scalars=(np.int64(n4),))

  def chain(x, y):
    for _ in range(CHAIN):
      x = add(x, y)
    return x

  key = jax.random.key(0)
  x = jax.random.normal(key, (N,), jnp.float32)
  y = jax.random.normal(jax.random.fold_in(key, 1), (N,), jnp.float32)
  f = jax.jit(chain)
  head = slice(0, 1 << 20)
  np.testing.assert_allclose(np.asarray(f(x, y)[head]), np.asarray(x[head]) + CHAIN * np.asarray(y[head]),
                             rtol=1e-5, atol=1e-4)
  kernel_s = timing.median_seconds(lambda: f(x, y).block_until_ready(), warmup=2, reps=10) / CHAIN
  copy_s = _copy_seconds(x.unsafe_buffer_pointer(), y.unsafe_buffer_pointer())
  kernel_bw, copy_bw = 3 * GIB / kernel_s, 2 * GIB / copy_s
  return {"vector_add_ms": kernel_s * 1e3, "vector_add_GBps": kernel_bw / 1e9, "copy_ms": copy_s * 1e3,
          "copy_GBps": copy_bw / 1e9, "ratio": kernel_bw / copy_bw}


def _copy_seconds(src: int, dst: int, reps: int = 12) -> float:
  """Median GPU time of cuMemcpyDtoD of 1 GiB, the first two calls left out."""
  from cuda.bindings import driver
  timing.primary_context()
  stream = timing.check(driver.cuStreamCreate(1))
  times = [timing.event_seconds(stream, lambda: timing.check(driver.cuMemcpyDtoDAsync(dst, src, GIB, stream)))
           for _ in range(reps)]
  return statistics.median(times[2:])


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  rows = [["vector add 1 GiB (mosaic_kernel; 3 GiB moved)", fmt(r["vector_add_ms"], 3), fmt(r["vector_add_GBps"], 0)],
          ["cuMemcpyDtoD 1 GiB (2 GiB moved)", fmt(r["copy_ms"], 3), fmt(r["copy_GBps"], 0)]]
  method = (f"A chain of {CHAIN} vector adds over 1 GiB float32 arrays in one jit, host-timed median of 10 "
            "calls; the copy is timed on the GPU with events, median of 10, in the same process.")
  return [method + "\n\n" + table(["", "time (ms)", "GB/s"], rows) +
          f"\n\nRatio (vector add / copy bandwidth): **{fmt(r['ratio'], 3)}**"]
