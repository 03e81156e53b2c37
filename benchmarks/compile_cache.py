"""Compile costs of a realistic kernel (kernels/fused_mlp.cu, ~140 lines).

cold: a fresh process with an empty disk cache (NVRTC runs).
warm from disk: a fresh process whose disk cache holds the kernel.
in-process hit: the same compile again in one process (memory cache).
Times are of jmf.cuda_kernel() alone, in a process whose JAX backend is up
(imports and backend start excluded).
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_PATH = os.path.join(HERE, "kernels", "fused_mlp.cu")

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


def child(cache_dir):
  env = dict(os.environ, JAX_MOSAIC_FFI_CACHE_DIR=cache_dir)
  out = subprocess.run([sys.executable, "-c", CHILD, SOURCE_PATH], env=env, capture_output=True, text=True,
                       timeout=600, cwd=tempfile.gettempdir())
  if out.returncode != 0:
    raise RuntimeError(out.stderr[-2000:])
  return json.loads(out.stdout.strip().splitlines()[-1])


def main():
  cold, warm, hits = [], [], []
  for _ in range(3):
    with tempfile.TemporaryDirectory() as cache_dir:
      first = child(cache_dir)
      assert first["nvrtc"] >= 1, first
      second = child(cache_dir)
      assert second["nvrtc"] == 0 and second["disk_hits"] == 1, second
      cold.append(first["first_s"])
      warm.append(second["first_s"])
      hits.extend([first["hit_s"], second["hit_s"]])
  lines = sum(1 for _ in open(SOURCE_PATH))
  result = {"kernel_lines": lines, "cold_ms": statistics.median(cold) * 1e3,
            "warm_disk_ms": statistics.median(warm) * 1e3, "memory_hit_us": statistics.median(hits) * 1e6}
  result["warm_over_cold"] = result["warm_disk_ms"] / result["cold_ms"]
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
