"""The ways launch.py calls its trivial kernel: jitted chains, the kept-alive
and dropped timings, the raw driver floors and the collective stage counts.

The workload's sizes live here and launch.py reads them from here (one way: launch.py imports this module,
never the reverse). jax is imported inside functions: the parent process imports this module to render tables.
"""

from __future__ import annotations

from benchmarks import timing

CHAIN = 200             # calls in one jitted chain
N = 256                 # floats the trivial kernel adds one to
STAGE_EXECUTIONS = 10   # executions over which the collective target's stages are counted


def needed(function):
  if function is None:
    raise RuntimeError("no CUfunction: the raw driver paths failed")
  return function


def chain(call, length: int = CHAIN):
  def f(x):
    for _ in range(length):
      x = call(x)
    return x
  return f


def checked(fn, x, adds):
  """Jits `fn`, runs it once and checks that it really ran its kernels."""
  import jax
  import numpy as np
  jitted = jax.jit(fn)
  out = jitted(x)
  if adds is not None:
    np.testing.assert_allclose(np.asarray(out), np.asarray(x) + adds, rtol=1e-6)
  return jitted


def dropped(jitted, x):
  """The result dies at once: the allocator hands its address to the next call."""
  return lambda: jitted(x).block_until_ready()


def kept(jitted, x):
  """The result lives until the next call has its own, so outputs alternate
  between two addresses and XLA must update its command buffer every time."""
  held = []

  def call():
    out = jitted(x).block_until_ready()
    held[:] = [out]
  return call


def distinct_outputs(jitted, x, keep: bool, calls: int = 6) -> int:
  """How many output addresses `calls` calls saw: checks what dropped and kept claim."""
  held, seen = [], set()
  for _ in range(calls):
    out = jitted(x).block_until_ready()
    seen.add(out.unsafe_buffer_pointer())
    held[:] = [out] if keep else []
    del out
  return len(seen)


def mosaic(kernel, uses_pdl: bool | None = None):
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((N,), jnp.float32), grid=1, block=N,
                           scalars=(np.int32(N),), uses_pdl=uses_pdl)


def collective_chain():
  """The chain through the collective target: all_reduce over one device is the identity."""
  import functools

  import jax
  import numpy as np
  from jax.sharding import Mesh, PartitionSpec as P

  import jax_mosaic_ffi as jmf
  mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
  body = chain(functools.partial(jmf.ops.all_reduce, axis_name="x"))
  return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))


def pallas(backend: str):
  import jax
  import jax.numpy as jnp
  from jax.experimental import pallas as pl

  def body(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0

  if backend == "triton":
    from jax.experimental.pallas import triton as plgpu
  else:
    from jax._src.pallas.mosaic_gpu import pallas_call_registration  # noqa: F401  (registers the lowering)
    from jax.experimental.pallas import mosaic_gpu as plgpu
  return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32),
                        compiler_params=plgpu.CompilerParams())


def raw_paths(kernel, pdl_kernel, rounds: int) -> tuple[dict, object]:
  """Our kernel's cubin through the driver directly: stream launches and a graph;
  and `pdl_kernel` (the same, instrumented) captured with PDL launches, which
  stream capture turns into programmatic graph edges."""
  import ctypes
  import statistics
  import time

  from cuda.bindings import driver
  check = timing.check
  timing.primary_context()
  module = check(driver.cuModuleLoadData(kernel.images[0].data))
  add_one, spin = (check(driver.cuModuleGetFunction(module, name)) for name in (b"add_one", b"spin"))
  stream = check(driver.cuStreamCreate(1))
  x, y = (check(driver.cuMemAlloc(N * 4)) for _ in range(2))
  params = timing.Params(ctypes.c_uint64(int(x)), ctypes.c_uint64(int(y)), ctypes.c_int32(N))

  def launches():
    for _ in range(CHAIN):
      check(driver.cuLaunchKernel(add_one, 1, 1, 1, N, 1, 1, 0, stream, params.address, 0))

  def host_timed():
    start = time.perf_counter()
    launches()
    check(driver.cuStreamSynchronize(stream))
    return time.perf_counter() - start

  stream_s = min(timing.spin_then(stream, spin, launches) for _ in range(5))
  host_s = statistics.median(host_timed() for _ in range(rounds))
  check(driver.cuStreamBeginCapture(stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
  launches()
  graph = check(driver.cuStreamEndCapture(stream))
  exe = check(driver.cuGraphInstantiate(graph, 0))
  check(driver.cuGraphLaunch(exe, stream))
  graph_s = min(timing.spin_then(stream, spin, lambda: check(driver.cuGraphLaunch(exe, stream))) for _ in range(5))
  check(driver.cuStreamSynchronize(stream))
  pdl_module = check(driver.cuModuleLoadData(pdl_kernel.images[0].data))
  pdl_exe = _pdl_graph(stream, check(driver.cuModuleGetFunction(pdl_module, b"add_one")), params)
  check(driver.cuGraphLaunch(pdl_exe, stream))
  pdl_s = min(timing.spin_then(stream, spin, lambda: check(driver.cuGraphLaunch(pdl_exe, stream))) for _ in range(5))
  check(driver.cuStreamSynchronize(stream))
  us = {"raw_stream": stream_s, "raw_stream_host": host_s, "raw_graph": graph_s, "raw_graph_pdl": pdl_s}
  return {key: s / CHAIN * 1e6 for key, s in us.items()}, add_one


def _pdl_graph(stream, function, params):
  """An executable graph of CHAIN launches of `function` with programmatic
  stream serialization allowed, as XLA's PDL nodes are."""
  from cuda.bindings import driver
  check = timing.check
  attribute = driver.CUlaunchAttribute()
  attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
  attribute.value.programmaticStreamSerializationAllowed = 1
  config = driver.CUlaunchConfig()
  config.gridDimX = config.gridDimY = config.gridDimZ = 1
  config.blockDimX, config.blockDimY, config.blockDimZ = N, 1, 1
  config.sharedMemBytes = 0
  config.hStream = stream
  config.attrs = [attribute]
  config.numAttrs = 1
  check(driver.cuStreamBeginCapture(stream, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
  for _ in range(CHAIN):
    check(driver.cuLaunchKernelEx(config, function, params.address, 0))
  return check(driver.cuGraphInstantiate(check(driver.cuStreamEndCapture(stream)), 0))


def stamp(kernel):
  """x -> (x, the GPU clock as two uint32 words), read once the previous kernel is done."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  return jmf.mosaic_kernel(kernel, (jax.ShapeDtypeStruct((N,), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.uint32)),
                           grid=1, block=N, scalars=(np.int32(N),))


def gpu_us_per_call(fn, stamp_call, x, rounds: int = 30) -> float:
  """GPU time per call of the chain `fn`, between two clock stamps in the same
  jitted program: the median over `rounds` executions, divided by CHAIN. Host
  work before the graph or kernels start does not count."""
  import statistics

  import jax
  import numpy as np

  def stamped(v):
    v, start = stamp_call(v)
    v, stop = stamp_call(fn(v))
    return v, start, stop

  def ns(words):
    low, high = (int(w) for w in np.asarray(words))
    return high << 32 | low
  jitted = jax.jit(stamped)
  samples = []
  for i in range(rounds + 3):  # the first executions compile and record
    _, start, stop = jitted(x)
    if i >= 3:
      samples.append(ns(stop) - ns(start))
  return statistics.median(samples) / CHAIN / 1e3


def stage_counts(call, executions: int = STAGE_EXECUTIONS) -> dict:
  """How often XLA ran the collective target's prepare and initialize stages."""
  import jax_mosaic_ffi as jmf
  if call is None:
    return {"n/a": "the collective chain failed (see its error)"}
  before = jmf.kernel_cache_stats()
  if not hasattr(before, "collective_prepares"):
    return {"n/a": "this build's kernel_cache_stats() has no collective_prepares / collective_initializes"}
  for _ in range(executions):
    call()
  after = jmf.kernel_cache_stats()
  count = {f: (getattr(after, f) - getattr(before, f)) / executions
           for f in ("collective_prepares", "collective_initializes")}
  return {"executions": executions, "call_sites": CHAIN, "prepares_per_execution": count["collective_prepares"],
          "initializes_per_execution": count["collective_initializes"]}
