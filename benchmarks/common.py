"""Timing helpers shared by the benchmarks."""

import ctypes
import json
import statistics
import sys
import time

import numpy as np


def median_seconds(fn, *, warmup=3, reps=30):
  """Median wall time of `fn()` (which must block until its work is done)."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(reps):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def emit(result: dict) -> None:
  """The last line a benchmark prints: its results, for run_all.py."""
  print("RESULT " + json.dumps(result))
  sys.stdout.flush()


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


def spin_then(driver, stream, spin_function, body, *, spin_ns=20_000_000):
  """Times `body()`'s stream work on the GPU alone: a spin kernel holds the
  stream while the host enqueues it, so host launch speed does not count."""
  start, stop = (check(driver.cuEventCreate(0)) for _ in range(2))
  params = Params(ctypes.c_uint64(spin_ns))
  check(driver.cuLaunchKernel(spin_function, 1, 1, 1, 1, 1, 1, 0, stream, params.address, 0))
  check(driver.cuEventRecord(start, stream))
  body()
  check(driver.cuEventRecord(stop, stream))
  check(driver.cuEventSynchronize(stop))
  ms = check(driver.cuEventElapsedTime(start, stop))
  driver.cuEventDestroy(start)
  driver.cuEventDestroy(stop)
  return ms / 1e3
