"""What one call site costs outside the launch: instantiate, first run, compile.

instantiate: the extra XLA compile time per added call site of a cached
  kernel (65 call sites against 1), which is XLA's per-custom-call work plus
  our instantiate stage; the same for a plain FFI call, which has no
  instantiate, gives XLA's part.
first run: the first execution of a fresh kernel minus a warm one, which is
  loading its module onto the GPU (at its first execute).
"""

from __future__ import annotations

import statistics
import time
import traceback

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, table
from benchmarks.suite import Run

NAME = "sites"
TITLE = "Per call site"
ORDER = 30
RUNS = (Run("main"),)

N = 256
SITES = 65
TRIALS = 5
FRESH_KERNELS = 10
SOURCE = r'''
extern "C" __global__ void add_k(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + KVALUE;
}
'''


def _kernel(value):
  import jax_mosaic_ffi as jmf
  return jmf.cuda_kernel(SOURCE, "add_k", options=[f"-DKVALUE={value}.0f"])


def _call(kernel, n=N):
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((N,), jnp.float32), grid=1, block=N, scalars=(np.int32(n),))


def _compile_seconds(sites: int, make_call) -> float:
  """XLA compile time of a program with `sites` call sites. Each trial
  differs in a scalar so XLA's in-memory cache cannot answer it."""
  import jax
  import jax.numpy as jnp
  x = jax.ShapeDtypeStruct((N,), jnp.float32)
  times = []
  for trial in range(TRIALS):
    def f(v, trial=trial):
      for _ in range(sites):
        v = make_call(N - trial)(v)
      return v
    lowered = jax.jit(f).trace(x).lower()
    start = time.perf_counter()
    lowered.compile()
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _per_site_us(make_call) -> float:
  return (_compile_seconds(SITES, make_call) - _compile_seconds(1, make_call)) / (SITES - 1) * 1e6


def _first_run_extra_us() -> float:
  """First execution of a freshly compiled kernel minus a warm one, median over fresh kernels."""
  import jax
  import jax.numpy as jnp
  x = jnp.zeros((N,), jnp.float32)
  extra = []
  for i in range(FRESH_KERNELS):
    compiled = jax.jit(_call(_kernel(100 + i))).lower(x).compile()  # compiled outside the timing
    start = time.perf_counter()
    compiled(x).block_until_ready()
    first = time.perf_counter() - start
    extra.append(first - timing.median_seconds(lambda: compiled(x).block_until_ready(), reps=20))
  return statistics.median(extra) * 1e6


def run() -> dict:
  import jax
  import jax.numpy as jnp

  import jax_mosaic_ffi as jmf
  from benchmarks import baselines
  kernel = _kernel(1)
  jax.jit(_call(kernel))(jnp.zeros((N,), jnp.float32)).block_until_ready()
  before = jmf.kernel_cache_stats()
  per_site_us = _per_site_us(lambda n: _call(kernel, n))
  after = jmf.kernel_cache_stats()
  handler_us = (after.instantiate_seconds - before.instantiate_seconds) / max(
      1, after.instantiations - before.instantiations) * 1e6
  errors = {}
  try:
    plain_per_site_us = _per_site_us(lambda n: baselines.plain_ffi(N, n=n))
  except Exception:  # e.g. the baseline targets were not built: the rest still counts
    plain_per_site_us, errors["plain_ffi_per_call_site_us"] = None, traceback.format_exc()[-1500:]
  first_run_extra_us = _first_run_extra_us()
  start = time.perf_counter()
  _kernel(999)
  cold = time.perf_counter() - start
  start = time.perf_counter()
  _kernel(999)
  hit = time.perf_counter() - start
  return {"instantiate_per_call_site_us": per_site_us, "instantiate_handler_us": handler_us,
          "plain_ffi_per_call_site_us": plain_per_site_us, "first_run_extra_us": first_run_extra_us,
          "nvrtc_cold_compile_ms": cold * 1e3, "nvrtc_memory_hit_us": hit * 1e6, "errors": errors}


ROWS = (("XLA compile + instantiate per extra call site", "instantiate_per_call_site_us", "us"),
        ("the same for a plain FFI call (no instantiate)", "plain_ffi_per_call_site_us", "us"),
        ("of which our instantiate handler (timed inside it)", "instantiate_handler_us", "us"),
        ("first run of a fresh kernel (module load at its first execute)", "first_run_extra_us", "us"),
        ("NVRTC compile, trivial kernel, cold", "nvrtc_cold_compile_ms", "ms"),
        ("same compile, in-memory hit", "nvrtc_memory_hit_us", "us"))


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  rows = [[label, "n/a" if r.get(key) is None else f"{fmt(r[key], 1)} {unit}"] for label, key, unit in ROWS]
  notes = [f"- {key}: n/a: {last_line(error)}" for key, error in r.get("errors", {}).items()]
  method = (f"Per call site: XLA compile time of {SITES} call sites of one cached kernel against 1, median of "
            f"{TRIALS} trials, over {SITES - 1}; first run: first execution minus a warm one, median over "
            f"{FRESH_KERNELS} fresh kernels.")
  return [method + "\n\n" + table(["cost", "value"], rows) + ("\n\n" + "\n".join(notes) if notes else "")]
