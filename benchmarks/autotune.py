"""Autotuning a Triton matmul and a CUDA C++ tiled matmul, and what a second process saves.

Each kernel is autotuned over 9 configs (jmf.autotune / mosaic_kernel(configs=)).
In one process (the first, with an empty kernel cache): per-call times of the
autotuned call, of the first config, and of XLA's jnp.matmul on the same
inputs. Then a second process with the same disk cache: its time from the
call to its first result, against the first process's (which tunes: it
compiles and times every config). Where jax-triton imports, the same Triton
kernel with the winning config runs through it too: its per-call time, and
its time to first result in a fresh and in a warm process (Triton's own
cache warm).
"""

from __future__ import annotations

import json
import tempfile

from benchmarks.markdown import failure, fmt, last_line, sig, table
from benchmarks.suite import Run, json_child
from benchmarks.vs_jax_triton import jax_triton_versions

NAME = "autotune"
TITLE = "Autotuning: a Triton and a CUDA C++ matmul"
ORDER = 55
RUNS = (Run("main", timeout_s=400.0),)

TRITON_SHAPE = (4096, 4096, 4096)  # M, N, K; fp16 in and out, fp32 accumulation
CUDA_SHAPE = (2048, 2048, 2048)    # fp32

TRITON_CONFIGS = [
    dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    dict(BLOCK_M=256, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=4),
    dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4),
    dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4),
    dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=256, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=4),
]
CUDA_CONFIGS = [
    dict(BM=16, BN=16, BK=16, TM=1, TN=1), dict(BM=32, BN=32, BK=16, TM=2, TN=2),
    dict(BM=64, BN=64, BK=16, TM=4, TN=4), dict(BM=64, BN=64, BK=8, TM=4, TN=4),
    dict(BM=128, BN=64, BK=8, TM=8, TN=4), dict(BM=64, BN=128, BK=8, TM=4, TN=8),
    dict(BM=128, BN=128, BK=8, TM=8, TN=8), dict(BM=128, BN=128, BK=16, TM=8, TN=8),
    dict(BM=32, BN=32, BK=32, TM=1, TN=1),
]

# One child script, three roles: "ours" (first or second process), "jax_triton".
CHILD = r'''
import json, os, sys, time
start_process = time.perf_counter()
role = sys.argv[1]
import numpy as np
import jax, jax.numpy as jnp
jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(8)))  # JAX's own first compile: startup, not ours
from benchmarks import autotune as bench
out = {"startup_s": time.perf_counter() - start_process}
if role == "ours":
  import jax_mosaic_ffi as jmf
  calls = bench.our_calls()
  for name, (tuned, first, xla, inputs) in calls.items():
    start = time.perf_counter()
    jax.block_until_ready(jax.jit(tuned)(*inputs))
    out[name] = {"first_result_s": time.perf_counter() - start, "report": tuned.last_report}
  s = jmf.kernel_cache_stats()
  out["stats"] = {"triton_compiles": s.compiles["triton"], "nvrtc_compiles": s.compiles["nvrtc"],
                  "tunings": s.autotune_tunings, "autotune_disk_hits": s.autotune_disk_hits,
                  "disk_hits": s.disk_hits}
  if sys.argv[2] == "time":
    for name, (tuned, first, xla, inputs) in calls.items():
      paths = {"autotuned": jax.jit(tuned), "first_config": jax.jit(first), "xla": jax.jit(xla)}
      out[name]["us"] = {p: bench.gpu_us(f, inputs) for p, f in paths.items()}
      # Against numpy in fp32 on the first 256 rows, and against XLA's result.
      a, b = (np.asarray(x, np.float32) for x in inputs)
      ref = a[:256] @ b
      got = np.asarray(paths["autotuned"](*inputs), np.float32)
      out[name]["max_rel_err"] = float(np.max(np.abs(got[:256] - ref)) / np.max(np.abs(ref)))
      xla_out = np.asarray(xla(*inputs), np.float32)
      out[name]["max_rel_diff_xla"] = float(np.max(np.abs(got - xla_out)) / np.max(np.abs(xla_out)))
else:
  import jax_triton as jt
  config = json.loads(sys.argv[2])
  call, inputs = bench.jax_triton_call(jt, config)
  start = time.perf_counter()
  jax.block_until_ready(call(*inputs))
  out["first_result_s"] = time.perf_counter() - start
  if sys.argv[3] == "time":
    out["us"] = bench.gpu_us(call, inputs)
print("CHILD " + json.dumps(out))
'''


def gpu_us(call, inputs, calls: int = 10, rounds: int = 15) -> float:
  """GPU microseconds per call: the GPU clock around `calls` calls in one program (each after the last),
  median of `rounds` runs."""
  import statistics

  import jax

  from jax_mosaic_ffi.transforms import gpu_clock
  timed = jax.jit(gpu_clock.timed(gpu_clock.repeated(call, calls)))
  for _ in range(3):
    jax.block_until_ready(timed(*inputs))
  samples = []
  for _ in range(rounds):
    start, stop, _ = timed(*inputs)
    samples.append(gpu_clock.elapsed_s(start, stop) / calls)
  return statistics.median(samples) * 1e6


def _inputs(shape, dtype, seed):
  import jax
  import numpy as np
  m, n, k = shape
  rng = np.random.default_rng(seed)
  return [jax.device_put(rng.standard_normal(s, dtype=np.float32).astype(dtype)) for s in ((m, k), (k, n))]


def _matmul_scalars(a, b):
  """M, N, K and the strides of row-major A, B and C, as the grouped matmul takes them."""
  m, k = a.shape
  n = b.shape[1]
  return m, n, k, k, 1, n, 1, n, 1


def triton_factory():
  """The corpus's grouped matmul (kernels/triton_user.py) as one config's call (ours)."""
  import jax
  import numpy as np
  import jax_mosaic_ffi as jmf
  from benchmarks.kernels import triton_user
  kernel = jmf.triton_kernel(triton_user.grouped_matmul)

  def factory(meta):
    return jmf.mosaic_kernel(
        kernel.with_meta(meta), lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), a.dtype),
        grid=lambda meta, a, b: jmf.cdiv(a.shape[0], meta["BLOCK_M"]) * jmf.cdiv(b.shape[1], meta["BLOCK_N"]),
        scalars=lambda meta, a, b: tuple(np.int32(v) for v in _matmul_scalars(a, b)))
  return factory


def cuda_factory():
  from benchmarks.kernels import tiled_matmul
  return tiled_matmul.call


def our_calls() -> dict:
  """{name: (autotuned call, first config's call, XLA's matmul, inputs)}."""
  import jax.numpy as jnp
  import numpy as np
  import jax_mosaic_ffi as jmf
  triton = triton_factory()
  cuda = cuda_factory()
  return {
      "triton": (jmf.autotune(triton, configs=TRITON_CONFIGS, name="bench-triton-matmul"), triton(TRITON_CONFIGS[0]),
                 jnp.matmul, _inputs(TRITON_SHAPE, np.float16, 0)),
      "cuda": (jmf.autotune(cuda, configs=CUDA_CONFIGS, name="bench-cuda-tiled-matmul"), cuda(CUDA_CONFIGS[0]),
               lambda a, b: jnp.matmul(a, b, precision="highest"), _inputs(CUDA_SHAPE, np.float32, 1)),
  }


def jax_triton_call(jt, config):
  """The same kernel with one config through jax-triton. jax-triton passes outputs after every positional argument,
  and this kernel takes C third (the tutorial's order), so its sizes and strides go as keyword arguments, which
  jax-triton compiles in as constants (as benchmarks/vs_jax_triton.py passes them too)."""
  import jax
  import numpy as np
  from benchmarks.kernels import triton_user
  m, n, k = TRITON_SHAPE
  config = dict(config)
  warps, stages = config.pop("num_warps"), config.pop("num_stages")
  names = ("M", "N", "K", "stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn")
  a_aval, b_aval = jax.ShapeDtypeStruct((m, k), np.float16), jax.ShapeDtypeStruct((k, n), np.float16)
  scalars = dict(zip(names, _matmul_scalars(a_aval, b_aval)))

  def call(a, b):
    return jt.triton_call(a, b, kernel=triton_user.grouped_matmul, out_type=jax.ShapeDtypeStruct((m, n), a.dtype),
                          grid=lambda meta: (-(-m // meta["BLOCK_M"]) * -(-n // meta["BLOCK_N"]),),
                          num_warps=warps, num_stages=stages, **scalars, **config)
  return jax.jit(call), _inputs(TRITON_SHAPE, np.float16, 0)


def _child(args, env) -> dict:
  return json_child(CHILD, args, env, 240, tail=6000)


def run() -> dict:
  cache = tempfile.mkdtemp(prefix="jmf-autotune-bench-")
  # Triton's own cache, empty too: the first process compiles cold whatever ran on this machine before.
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": cache, "JAX_MOSAIC_FFI_POISON_OUTPUTS": "0",
         "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="jmf-autotune-bench-triton-")}
  first = _child(["ours", "time"], env)
  second = _child(["ours", "first-only"], env)
  result = {"first": first, "second": second, "triton_shape": TRITON_SHAPE, "cuda_shape": CUDA_SHAPE,
            "configs": {"triton": len(TRITON_CONFIGS), "cuda": len(CUDA_CONFIGS)}}
  winner = TRITON_CONFIGS[first["triton"]["report"]["winner"]]
  triton_cache = tempfile.mkdtemp(prefix="jmf-bench-triton-cache-")
  jt_env = {"TRITON_CACHE_DIR": triton_cache}
  try:
    result["jax_triton"] = {"cold": _child(["jax_triton", json.dumps(winner), "time"], jt_env),
                            "warm": _child(["jax_triton", json.dumps(winner), "first-only"], jt_env)}
  except Exception as e:  # reported in the table: jax-triton could not run here
    result["jax_triton"] = {"error": last_line(str(e)) + jax_triton_versions()}
  return result


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  first, second = r["first"], r["second"]
  rows = []
  for name, label, shape in (("triton", "Triton matmul (fp16)", r["triton_shape"]),
                             ("cuda", "CUDA C++ tiled matmul (fp32)", r["cuda_shape"])):
    us = first[name]["us"]
    rows.append([f"{label}, {'x'.join(map(str, shape))}", sig(us["autotuned"]), sig(us["first_config"]),
                 fmt(us["first_config"] / us["autotuned"], 2), sig(us["xla"]), fmt(us["autotuned"] / us["xla"], 2),
                 f"{fmt(first[name]['first_result_s'], 2)} s", f"{fmt(second[name]['first_result_s'], 2)} s"])
  jt = r.get("jax_triton", {})
  if "error" in jt:
    jt_text = f"jax-triton could not run: {jt['error']}"
  else:
    ours = first["triton"]["us"]["autotuned"]
    cold, warm = jt["cold"], jt["warm"]
    jt_text = (f"jax-triton ran the same Triton kernel with the winning config: {sig(cold['us'])} us per call "
               f"({fmt(cold['us'] / ours, 2)}x ours); time to first result {fmt(cold['first_result_s'], 2)} s "
               f"in a fresh process, {fmt(warm['first_result_s'], 2)} s in a warm one (Triton's cache warm; "
               f"it compiles the one config, and tunes nothing), against our second process's "
               f"{fmt(second['triton']['first_result_s'], 2)} s.")
  s1, s2 = first["stats"], second["stats"]
  method = (f"Each kernel autotuned over {r['configs']['triton']} / {r['configs']['cuda']} configs; per-call times "
            "in microseconds of GPU time (the GPU's clock around 10 calls in one program, median of 15 runs), in the "
            "first process. XLA is "
            "`jnp.matmul` (fp32 at `precision='highest'`). The first process starts with empty kernel caches (ours "
            "and Triton's), "
            "so its first call compiles and times every config; the second process finds the winners on disk. Both "
            "processes' times to first result start after JAX's own first compile (a trivial jit), which is "
            f"startup ({fmt(first['startup_s'], 2)} s and {fmt(second['startup_s'], 2)} s). "
            f"First process: {s1['triton_compiles']} Triton compiles, {s1['nvrtc_compiles']} NVRTC compiles, "
            f"{s1['tunings']} tunings; second: {s2['triton_compiles']} Triton compiles, {s2['nvrtc_compiles']} "
            f"NVRTC compiles, {s2['tunings']} tunings, {s2['autotune_disk_hits']} winners from disk. Largest "
            f"error of the autotuned result against numpy in fp32 (first 256 rows), relative to the largest "
            f"element: Triton {first['triton']['max_rel_err']:.1e}, CUDA C++ {first['cuda']['max_rel_err']:.1e}; "
            f"against XLA's result: {first['triton'].get('max_rel_diff_xla', 0):.1e} and "
            f"{first['cuda'].get('max_rel_diff_xla', 0):.1e}.")
  header = ["kernel", "autotuned us", "first config us", "speedup", "XLA us", "vs XLA", "1st process to 1st result",
            "2nd process to 1st result"]
  return [method + "\n\n" + table(header, rows) + "\n\n" + jt_text]
