"""Compile costs of a realistic kernel (kernels/fused_mlp.cu, ~140 lines).

cold: a fresh process with an empty disk cache (NVRTC runs).
warm from disk: a fresh process whose disk cache holds the kernel.
in-process hit: the same compile again in one process (memory cache).
Times are of jmf.cuda_kernel() alone, in a process whose JAX backend is up
(imports and backend start excluded).

typed check: after the first compile, what checking each parameter's C++ type
against a call's arrays and scalars costs per new call signature (new
shapes), measured on the check alone (its type cache emptied each time), and
the trace of a new signature with the types known over the same trace without
them. The types come from the same NVRTC call (one per target) and from the
disk entry in the second process, which compiles nothing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.markdown import failure, fmt, table
from benchmarks.suite import Run

NAME = "compile"
TITLE = "Compile caches"
ORDER = 40
RUNS = (Run("main"),)

SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels", "fused_mlp.cu")
PROCESS_PAIRS = 3

CHILD = r'''
import json, sys, time
import jax
jax.devices()  # a JAX program has its backend up before it makes kernels
import jax_mosaic_ffi as jmf
source = open(sys.argv[1]).read()
start = time.perf_counter()
kernel = jmf.cuda_kernel(source, "fused_mlp_gemm")
first = time.perf_counter() - start
hits = []
for _ in range(200):
  start = time.perf_counter()
  jmf.cuda_kernel(source, "fused_mlp_gemm")
  hits.append(time.perf_counter() - start)
hits.sort()
s = jmf.kernel_cache_stats()
import dataclasses, gc, statistics
import jax.numpy as jnp, numpy as np
from jax_mosaic_ffi.call import param_types as typed_check
from jax_mosaic_ffi.call.launch_options import LaunchOptions
from jax_mosaic_ffi.cuda import launch as cuda_launch
from jax_mosaic_ffi.cuda.launch_options import CudaOptions
from jax_mosaic_ffi.toolchain import param_types
untyped = dataclasses.replace(kernel, compiled=dataclasses.replace(kernel.compiled, param_types=None))
def call_for(k, m):
  return jax.jit(jmf.mosaic_kernel(k, jax.ShapeDtypeStruct((m, 64), jnp.bfloat16), grid=(1, m), block=256,
                                   scalars=(np.int32(m), np.int32(64), np.int32(64))))
def avals(m):
  return (jax.ShapeDtypeStruct((m, 64), jnp.bfloat16), jax.ShapeDtypeStruct((64, 64), jnp.bfloat16),
          jax.ShapeDtypeStruct((64,), jnp.float32))
checks, typed_traces, untyped_traces = [], [], []
for m in range(1, 61):
  pair = ((kernel, typed_traces), (untyped, untyped_traces))
  for k, times in pair if m % 2 else pair[::-1]:  # neither always first: the first trace of a shape warms caches
    start = time.perf_counter()
    call_for(k, m).trace(*avals(m))
    times.append(time.perf_counter() - start)
  options = CudaOptions(grid=(1, m), block=256, scalars=(np.int32(m), np.int32(64), np.int32(64)))
  launch = cuda_launch.checked(kernel, jax.ShapeDtypeStruct((m, 64), jnp.bfloat16), LaunchOptions(), options, "bench")
  spec_avals = [jax.core.ShapedArray(a.shape, a.dtype) for a in avals(m)]
  spec, out, _ = launch.spec(spec_avals, "bench")
  param_types.parsed.cache_clear()
  gc.collect()
  gc.disable()  # a collection's pause is not the check's
  start = time.perf_counter()
  typed_check.check(kernel, spec, spec_avals, out, "bench")
  checks.append(time.perf_counter() - start)
  gc.enable()
print(json.dumps({"first_s": first, "hit_s": hits[len(hits) // 2], "nvrtc": s.compiles["nvrtc"],
                  "disk_hits": s.disk_hits, "typed": kernel.param_types is not None,
                  "targets": sum(i.kind.name == "CUBIN" for i in kernel.images),
                  "check_s": statistics.median(checks), "check_max_s": max(checks),
                  "trace_typed_s": statistics.median(typed_traces),
                  "trace_untyped_s": statistics.median(untyped_traces)}))
'''


def _child(cache_dir: str) -> dict:
  env = dict(os.environ, JAX_MOSAIC_FFI_CACHE_DIR=cache_dir)
  out = subprocess.run([sys.executable, "-c", CHILD, SOURCE_PATH], env=env, capture_output=True, text=True,
                       timeout=120, cwd=tempfile.gettempdir())
  if out.returncode != 0:
    raise RuntimeError(out.stderr[-2000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> dict:
  cold, warm, hits, checks, traces, check_max = [], [], [], [], [], 0.0
  for _ in range(PROCESS_PAIRS):
    with tempfile.TemporaryDirectory() as cache_dir:
      first = _child(cache_dir)
      assert first["nvrtc"] == first["targets"] and first["typed"], first  # no second compile
      second = _child(cache_dir)
      assert second["nvrtc"] == 0 and second["disk_hits"] == 1 and second["typed"], second
      checks.extend([first["check_s"], second["check_s"]])
      check_max = max(check_max, first["check_max_s"], second["check_max_s"])
      traces.extend([first["trace_typed_s"] / first["trace_untyped_s"],
                     second["trace_typed_s"] / second["trace_untyped_s"]])
      cold.append(first["first_s"])
      warm.append(second["first_s"])
      hits.extend([first["hit_s"], second["hit_s"]])
  with open(SOURCE_PATH) as f:
    lines = sum(1 for _ in f)
  result = {"kernel_lines": lines, "cold_ms": statistics.median(cold) * 1e3,
            "warm_disk_ms": statistics.median(warm) * 1e3, "memory_hit_us": statistics.median(hits) * 1e6}
  result["warm_over_cold"] = result["warm_disk_ms"] / result["cold_ms"]
  result["typed_check_us"] = statistics.median(checks) * 1e6
  result["typed_check_max_us"] = check_max * 1e6
  result["typed_over_untyped_trace"] = statistics.median(traces)
  return result


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  rows = [["cold (NVRTC)", f"{fmt(r['cold_ms'], 1)} ms"],
          ["warm from disk, fresh process",
           f"{fmt(r['warm_disk_ms'], 2)} ms ({fmt(100 * r['warm_over_cold'], 1)}% of cold)"],
          ["in-process hit", f"{fmt(r['memory_hit_us'], 1)} us"]]
  if "typed_check_us" in r:
    rows += [["typed check, per new call signature (median / max)",
              f"{fmt(r['typed_check_us'], 1)} / {fmt(r['typed_check_max_us'], 1)} us"],
             ["trace of a new signature, typed / untyped", f"{fmt(r['typed_over_untyped_trace'], 3)}x"]]
  method = (f"`benchmarks/kernels/fused_mlp.cu` ({r['kernel_lines']} lines), `jmf.cuda_kernel` alone, medians of "
            f"{PROCESS_PAIRS} fresh processes each (the in-process hit: of 200 repeats in each; the typed check: "
            "of 60 new shapes in each, the kernel compiled once per target, its types read back from disk).")
  return [method + "\n\n" + table(["path", "time"], rows)]
