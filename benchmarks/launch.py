"""Per-call time of a trivial kernel in a jitted chain of 200 calls.

One process per command-buffer mode (XLA reads XLA_FLAGS once):
    python launch_overhead.py --command-buffers on|off
It prints a RESULT line with microseconds per call for each path:
raw stream launches and a raw CUDA graph (the floor, timed on the GPU),
mosaic_kernel (and its staged variant), a plain hand-made jax.ffi call,
Pallas on Triton (XLA's own kernel thunk) and Pallas on Mosaic GPU
(jaxlib's mosaic_gpu_v2).
"""

import argparse
import traceback
import ctypes
import os
import statistics
import sys
import time

CHAIN = 200
N = 256

parser = argparse.ArgumentParser()
parser.add_argument("--command-buffers", choices=["on", "off"], required=True)
parser.add_argument("--reps", type=int, default=40)
args = parser.parse_args()
os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + (
    "" if args.command_buffers == "on" else " --xla_gpu_enable_command_buffer=")
os.environ.setdefault("JAX_MOSAIC_FFI_POISON_OUTPUTS", "0")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from cuda.bindings import driver  # noqa: E402

import jax_mosaic_ffi as jmf  # noqa: E402
from jax_mosaic_ffi import contract  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from common import Params, check, emit, spin_then  # noqa: E402

SOURCE = r'''
extern "C" __global__ void add_one(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
'''


def prepared(fn, x, check=True):
  """Jits, runs once and checks `fn`; returns the timed call."""
  jitted = jax.jit(fn)
  out = jitted(x)
  if check:
    np.testing.assert_allclose(np.asarray(out), np.asarray(x) + CHAIN)  # really ran 200 kernels
  return lambda: jitted(x).block_until_ready()


def interleaved_us(calls: dict, rounds: int) -> dict:
  """Per-call microseconds of each path, timed in turn round after round so
  that drift in the machine's state hits every path alike; medians."""
  for call in calls.values():
    for _ in range(3):
      call()
  times = {name: [] for name in calls}
  for _ in range(rounds):
    for name, call in calls.items():
      start = time.perf_counter()
      call()
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) / CHAIN * 1e6 for name, t in times.items()}


def chain(call):
  def f(x):
    for _ in range(CHAIN):
      x = call(x)
    return x
  return f


def mosaic(kernel):
  return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((N,), jnp.float32), grid=1, block=N,
                           scalars=(np.int32(N),))


def raw_paths(kernel):
  """Our kernel's cubin through the driver directly: stream launches and a graph."""
  check(driver.cuInit(0))
  device = check(driver.cuDeviceGet(0))
  context = check(driver.cuDevicePrimaryCtxRetain(device))
  check(driver.cuCtxSetCurrent(context))
  module = check(driver.cuModuleLoadData(kernel.images[0].data))
  add_one = check(driver.cuModuleGetFunction(module, b"add_one"))
  spin = check(driver.cuModuleGetFunction(module, b"spin"))
  stream = check(driver.cuStreamCreate(1))
  x = check(driver.cuMemAlloc(N * 4))
  y = check(driver.cuMemAlloc(N * 4))
  params = Params(ctypes.c_uint64(int(x)), ctypes.c_uint64(int(y)), ctypes.c_int32(N))

  def launches():
    for _ in range(CHAIN):
      check(driver.cuLaunchKernel(add_one, 1, 1, 1, N, 1, 1, 0, stream, params.address, 0))

  stream_s = min(spin_then(driver, stream, spin, launches) for _ in range(5))

  def host_timed():
    start = time.perf_counter()
    launches()
    check(driver.cuStreamSynchronize(stream))
    return time.perf_counter() - start

  host_s = statistics.median(host_timed() for _ in range(args.reps))
  check(driver.cuStreamBeginCapture(stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
  launches()
  graph = check(driver.cuStreamEndCapture(stream))
  exe = check(driver.cuGraphInstantiate(graph, 0))
  check(driver.cuGraphLaunch(exe, stream))
  graph_s = min(spin_then(driver, stream, spin, lambda: check(driver.cuGraphLaunch(exe, stream))) for _ in range(5))
  check(driver.cuStreamSynchronize(stream))
  return stream_s / CHAIN * 1e6, graph_s / CHAIN * 1e6, host_s / CHAIN * 1e6, module, add_one


def plain_ffi(function):
  from jax._src.lib import xla_client
  jax.ffi.register_ffi_target("jax_mosaic_ffi_bench_plain", {"execute": jmf._core.baseline_ffi_handler()},
                              platform="CUDA", api_version=1,
                              traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)
  call = jax.ffi.ffi_call("jax_mosaic_ffi_bench_plain", jax.ShapeDtypeStruct((N,), jnp.float32))
  return lambda x: call(x, function=np.int64(int(function)), grid=np.int32(1), block=np.int32(N), n=np.int32(N))


def empty_ffi():
  from jax._src.lib import xla_client
  jax.ffi.register_ffi_target("jax_mosaic_ffi_bench_empty", {"execute": jmf._core.empty_ffi_handler()},
                              platform="CUDA", api_version=1,
                              traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)
  return jax.ffi.ffi_call("jax_mosaic_ffi_bench_empty", jax.ShapeDtypeStruct((N,), jnp.float32))


def pallas(backend):
  from jax.experimental import pallas as pl

  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

  if backend == "triton":
    from jax.experimental.pallas import triton as plgpu
    params = plgpu.CompilerParams()
  else:
    from jax._src.pallas.mosaic_gpu import pallas_call_registration  # noqa: F401  (registers the lowering)
    from jax.experimental.pallas import mosaic_gpu as plgpu
    params = plgpu.CompilerParams()
  return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), compiler_params=params)


def main():
  kernel = jmf.cuda_kernel(SOURCE, "add_one")
  x = jnp.asarray(np.random.default_rng(0).standard_normal(N).astype(np.float32))
  results = {"command_buffers": args.command_buffers, "chain": CHAIN}
  calls = {"mosaic_kernel": prepared(chain(mosaic(kernel)), x)}
  os.environ[contract.STAGED_ENV] = "1"
  calls["mosaic_kernel (staged prepare)"] = prepared(chain(mosaic(kernel)), x)
  del os.environ[contract.STAGED_ENV]
  stream_us, graph_us, host_us, module, function = raw_paths(kernel)
  results["raw stream launches"] = stream_us
  results["raw stream launches (host wall)"] = host_us
  results["raw CUDA graph"] = graph_us
  calls["plain jax.ffi call"] = prepared(chain(plain_ffi(function)), x)
  calls["XLA custom call, empty handler"] = prepared(chain(empty_ffi()), x, check=False)
  for name, backend in (("XLA kernel (Pallas/Triton)", "triton"), ("mosaic_gpu_v2 (Pallas/Mosaic GPU)", "mosaic")):
    try:
      calls[name] = prepared(chain(pallas(backend)), x)
    except Exception:  # reported, not fatal: the others still count
      results[name] = None
      results[f"{name} error"] = traceback.format_exc()[-1200:]
  results.update(interleaved_us(calls, args.reps))
  results["registration"] = jmf.registration.status()["message"]
  emit(results)


if __name__ == "__main__":
  main()
