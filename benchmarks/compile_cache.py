"""Compile costs of a realistic kernel (kernels/fused_mlp.cu, ~140 lines).

cold: a fresh process with an empty disk cache (NVRTC runs).
warm from disk: a fresh process whose disk cache holds the kernel.
in-process hit: the same compile again in one process (memory cache).
Times are of jmf.cuda_kernel() alone, in a process whose JAX backend is up
(imports and backend start excluded).
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
print(json.dumps({"first_s": first, "hit_s": hits[len(hits) // 2], "nvrtc": s.nvrtc_compiles,
                  "disk_hits": s.disk_hits}))
'''


def _child(cache_dir: str) -> dict:
  env = dict(os.environ, JAX_MOSAIC_FFI_CACHE_DIR=cache_dir)
  out = subprocess.run([sys.executable, "-c", CHILD, SOURCE_PATH], env=env, capture_output=True, text=True,
                       timeout=120, cwd=tempfile.gettempdir())
  if out.returncode != 0:
    raise RuntimeError(out.stderr[-2000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def run() -> dict:
  cold, warm, hits = [], [], []
  for _ in range(PROCESS_PAIRS):
    with tempfile.TemporaryDirectory() as cache_dir:
      first = _child(cache_dir)
      assert first["nvrtc"] >= 1, first
      second = _child(cache_dir)
      assert second["nvrtc"] == 0 and second["disk_hits"] == 1, second
      cold.append(first["first_s"])
      warm.append(second["first_s"])
      hits.extend([first["hit_s"], second["hit_s"]])
  with open(SOURCE_PATH) as f:
    lines = sum(1 for _ in f)
  result = {"kernel_lines": lines, "cold_ms": statistics.median(cold) * 1e3,
            "warm_disk_ms": statistics.median(warm) * 1e3, "memory_hit_us": statistics.median(hits) * 1e6}
  result["warm_over_cold"] = result["warm_disk_ms"] / result["cold_ms"]
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
  method = (f"`benchmarks/kernels/fused_mlp.cu` ({r['kernel_lines']} lines), `jmf.cuda_kernel` alone, medians of "
            f"{PROCESS_PAIRS} fresh processes each (the in-process hit: of 200 repeats in each).")
  return [method + "\n\n" + table(["path", "time"], rows)]
