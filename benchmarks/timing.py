"""Timing helpers shared by the benchmarks: host medians, interleaved paths,
GPU-side timing with events and behind a spin kernel, raw driver calls.

cuda-python is imported inside the functions that use it, so that importing
this module costs nothing (the report imports the benchmark modules).
"""

from __future__ import annotations

import ctypes
import statistics
import time
from typing import Callable

# Holds the stream while the host enqueues the timed work, so that host
# launch speed does not count; add it to a module of kernels being timed.
SPIN_SOURCE = r'''
extern "C" __global__ void spin(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
'''


def median_seconds(fn: Callable[[], object], *, warmup: int = 3, reps: int = 30) -> float:
  """Median wall time of `fn()`, which must block until its work is done."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def interleaved(calls: dict[str, Callable[[], object]], rounds: int, *, warmup: int = 3) -> dict[str, float]:
  """Median seconds of each blocking call, timed in turn round after round so
  that drift in the machine's state (clocks, other tenants) hits every path alike."""
  for call in calls.values():
    for _ in range(warmup):
      call()
  times = {name: [] for name in calls}
  for _ in range(rounds):
    for name, call in calls.items():
      start = time.perf_counter()
      call()
      times[name].append(time.perf_counter() - start)
  return {name: statistics.median(t) for name, t in times.items()}


def interleaved_samples(samplers: dict[str, Callable[[], float]], rounds: int, *, warmup: int = 3) -> dict[str, float]:
  """Median of what each sampler measures itself (GPU seconds between two stamps or events), taken in turn round
  after round as `interleaved` takes wall times."""
  for _ in range(warmup):  # everything compiled, the clocks up
    for sample in samplers.values():
      sample()
  samples = {name: [] for name in samplers}
  for _ in range(rounds):
    for name, sample in samplers.items():
      samples[name].append(sample())
  return {name: statistics.median(s) for name, s in samples.items()}


def host_cost_per_call(ours: Callable[[], object], eager: Callable[..., object], calls: int,
                       synchronize: Callable[[], object], rounds: int = 30) -> tuple[float, float, float]:
  """Microseconds per call on the host, as (ours, eager, enqueue): ``ours()``, a jitted chain of `calls` launches
  that blocks until done, against ``eager()``, the same launches through a native launcher's eager loop and a
  synchronize, interleaved; and the eager loop's enqueue alone (``eager(sync=False)``, timed, then
  ``synchronize()``)."""
  seconds = interleaved({"ours": ours, "eager": eager}, rounds)
  enqueue = []
  for _ in range(rounds):
    start = time.perf_counter()
    eager(sync=False)
    enqueue.append(time.perf_counter() - start)
    synchronize()
  return seconds["ours"] / calls * 1e6, seconds["eager"] / calls * 1e6, statistics.median(enqueue) / calls * 1e6


def stamped_sampler(program: Callable, args, calls: int) -> Callable[[], float]:
  """A sampler of GPU seconds per call of `program`, a jitted ``gpu_clock.timed`` chain of `calls` calls."""
  from jax_mosaic_ffi.transforms import gpu_clock

  def sample() -> float:
    start, stop, _ = program(*args)
    return gpu_clock.elapsed_s(start, stop) / calls
  return sample


def chained(fn: Callable, calls: int) -> Callable:
  """`fn` applied `calls` times, each call on the last one's result (jit it: a chain inside one program)."""
  def chain(x):
    for _ in range(calls):
      x = fn(x)
    return x
  return chain


def host_us_per_call(chains: dict[str, Callable[[], object]], calls: int, rounds: int = 30) -> dict:
  """Wall microseconds per call of each blocking chain of `calls` calls, interleaved (`interleaved`)."""
  if not chains:
    return {}
  seconds = interleaved(chains, rounds)
  return {"us_per_call": {name: s / calls * 1e6 for name, s in seconds.items()}, "chain": calls}


def check(result):
  """Unpacks a cuda-python result tuple, raising on an error code."""
  err, *values = result if isinstance(result, tuple) else (result,)
  if int(err) != 0:
    raise RuntimeError(f"CUDA call failed: {err!r}")
  return values[0] if len(values) == 1 else tuple(values) if values else None


class Params:
  """A void** kernel-parameter array for cuda-python launches."""

  def __init__(self, *values):
    self._values = list(values)  # ctypes values, kept alive with the array
    self._array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in self._values])

  @property
  def address(self) -> int:
    return ctypes.addressof(self._array)


def primary_context(ordinal: int = 0):
  """Makes device `ordinal`'s primary context (the one JAX uses) current."""
  from cuda.bindings import driver
  check(driver.cuInit(0))
  context = check(driver.cuDevicePrimaryCtxRetain(check(driver.cuDeviceGet(ordinal))))
  check(driver.cuCtxSetCurrent(context))
  return context


def event_seconds(stream, body: Callable[[], None]) -> float:
  """GPU time of the stream work `body()` enqueues, between two events."""
  from cuda.bindings import driver
  start, stop = (check(driver.cuEventCreate(0)) for _ in range(2))
  check(driver.cuEventRecord(start, stream))
  body()
  check(driver.cuEventRecord(stop, stream))
  check(driver.cuEventSynchronize(stop))
  ms = check(driver.cuEventElapsedTime(start, stop))
  driver.cuEventDestroy(start)
  driver.cuEventDestroy(stop)
  return ms / 1e3


def spin_then(stream, spin_function, body: Callable[[], None], *, spin_ns: int = 20_000_000) -> float:
  """GPU time of `body()`'s stream work alone: a spin kernel holds the stream
  while the host enqueues it, so host launch speed does not count."""
  from cuda.bindings import driver
  params = Params(ctypes.c_uint64(spin_ns))
  check(driver.cuLaunchKernel(spin_function, 1, 1, 1, 1, 1, 1, 0, stream, params.address, 0))
  return event_seconds(stream, body)
