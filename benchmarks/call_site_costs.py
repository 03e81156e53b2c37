"""What one call site costs outside the launch: instantiate, first run, compile.

instantiate: the extra XLA compile time per added call site of a cached
  kernel (64 call sites against 1), which is XLA's per-custom-call work plus
  our instantiate stage; the same for a plain FFI call, which has no
  instantiate, gives XLA's part.
first run: the first execution of a fresh kernel minus a warm one, which is
  loading its module onto the GPU (prepare).
"""

import os
import sys
import time

os.environ.setdefault("JAX_MOSAIC_FFI_POISON_OUTPUTS", "0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_mosaic_ffi as jmf  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from common import emit, median_seconds  # noqa: E402

N = 256
SOURCE = r'''
extern "C" __global__ void add_k(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + KVALUE;
}
'''


def kernel(value):
  return jmf.cuda_kernel(SOURCE, "add_k", options=[f"-DKVALUE={value}.0f"])


def call(k, n=N):
  return jmf.mosaic_kernel(k, jax.ShapeDtypeStruct((N,), jnp.float32), grid=1, block=N, scalars=(np.int32(n),))


def plain_ffi_call(n=N):
  from jax._src.lib import xla_client
  jax.ffi.register_ffi_target("jax_mosaic_ffi_bench_plain", {"execute": jmf._core.baseline_ffi_handler()},
                              platform="CUDA", api_version=1,
                              traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)
  ffi = jax.ffi.ffi_call("jax_mosaic_ffi_bench_plain", jax.ShapeDtypeStruct((N,), jnp.float32))
  return lambda x: ffi(x, function=np.int64(0), grid=np.int32(1), block=np.int32(N), n=np.int32(n))


def compile_seconds(sites, make_call):
  """XLA compile time of a program with `sites` call sites. Each trial
  differs in a scalar so XLA's in-memory cache cannot answer it."""
  x = jax.ShapeDtypeStruct((N,), jnp.float32)
  times = []
  for trial in range(5):
    def f(v, trial=trial):
      for _ in range(sites):
        v = make_call(N - trial)(v)
      return v
    lowered = jax.jit(f).trace(x).lower()
    start = time.perf_counter()
    lowered.compile()
    times.append(time.perf_counter() - start)
  return float(np.median(times))


def main():
  x = jnp.zeros((N,), jnp.float32)
  k = kernel(1)
  jax.jit(call(k))(x).block_until_ready()
  before = jmf.kernel_cache_stats()
  one, many = compile_seconds(1, lambda n: call(k, n)), compile_seconds(65, lambda n: call(k, n))
  after = jmf.kernel_cache_stats()
  inside_us = (after.instantiate_seconds - before.instantiate_seconds) / max(
      1, after.instantiations - before.instantiations) * 1e6
  per_site_us = (many - one) / 64 * 1e6
  plain_one, plain_many = compile_seconds(1, plain_ffi_call), compile_seconds(65, plain_ffi_call)
  plain_per_site_us = (plain_many - plain_one) / 64 * 1e6
  firsts, warms = [], []
  for i in range(10):
    fresh = jax.jit(call(kernel(100 + i)))
    fresh.lower(x).compile()  # compile outside the timing
    compiled = fresh.lower(x).compile()
    start = time.perf_counter()
    compiled(x).block_until_ready()
    firsts.append(time.perf_counter() - start)
    warms.append(median_seconds(lambda: compiled(x).block_until_ready(), reps=20))
  start = time.perf_counter()
  kernel(999)
  cold_compile = time.perf_counter() - start
  start = time.perf_counter()
  kernel(999)
  warm_compile = time.perf_counter() - start
  emit({"instantiate_per_call_site_us": per_site_us, "instantiate_handler_us": inside_us, "plain_ffi_per_call_site_us": plain_per_site_us, "compile_1_site_ms": one * 1e3,
        "compile_65_sites_ms": many * 1e3,
        "first_run_extra_us": float(np.median(np.array(firsts) - np.array(warms))) * 1e6,
        "nvrtc_cold_compile_ms": cold_compile * 1e3, "nvrtc_memory_hit_us": warm_compile * 1e6})


if __name__ == "__main__":
  main()
