"""Cold start: a fresh process to its first result, without and with a kernel pack.

Each workload is one program of the corpus kernels: every CUDA corpus kernel (kernels/cuda_corpus.py), the
Triton grouped matmul autotuned over 9 configs (benchmarks/autotune.py's), a Gluon Hopper GEMM
(kernels/gluon_user.py), a CuTe DSL Hopper GEMM (kernels/cute_gemm.py), and FlashAttention-4's forward and quack's
softmax where those are installed. Each runs in fresh processes, timed from after its imports and JAX's own start
until every call's first result is back:

- cold: empty kernel caches (ours, Triton's): every kernel compiles, the autotuned call times its configs; its
  timings are saved (jmf.save_tuning) for the pack;
- warm disk: the cold run's disk cache: nothing compiles, nothing is timed;
- pack: an empty disk cache and the pack, recorded on the CPU by `python -m jax_mosaic_ffi.pack record` for this
  GPU's arch with the cold run's tuning file, under JAX_MOSAIC_FFI_PACKS_STRICT=1 (a compile would fail the run);
- pack and XLA's cache: as "pack", with JAX's persistent compilation cache the cold run filled
  (``jax_compilation_cache_dir``): the pack covers the kernels, that cache the XLA program (docs/guides/deploying.md).

Each run's time is told in two parts as well: the kernels' (building the calls, then tracing and lowering each
jitted step: where kernels compile, or come from a cache or the pack, and an autotuned call times its configs) and
XLA's compile of the lowered program (``Lowered.compile``); the rest is running it.

The same work cold through the peers, where their packages are importable (else the row says why not): the Triton
matmul's 9 configs through jax-triton's ``triton_call`` (one call per config: jax-triton compiles each; it has no
autotuning over them here), and the CuTe DSL GEMM through ``cutlass.jax.cutlass_call``. They have no pack, so only
their cold run is measured.

The goal: with a pack, a first result in at most 1.2x the warm disk cache's time, and nothing compiled or tuned.

Its "compilers" run (benchmarks/cold_compile.py, on the CPU too): a cold compile per front end against its native
compiler alone (NVRTC as CuPy calls it, ``triton.compile``, ``cute.compile``).
By hand: `python -m benchmarks --only cold_start`.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks import REPO
from benchmarks import cold_compile
from benchmarks.markdown import failure, fmt, last_line, table
from benchmarks.suite import Run, json_child

NAME = "cold_start"
TITLE = "Cold start: a fresh process to its first result, with a kernel pack"
ORDER = 42
COMPILERS = "compilers"  # each front end's cold compile against its native compiler's (cold_compile.py)
# The corpus's CUDA and Triton kernels; then those of the DSLs built on Triton and the CuTe DSL (each n/a where it is
# not installed, or where its kernel is Hopper's and the GPU is not).
RUNS = (Run("main", kwargs={"workloads": ("cuda_corpus", "triton_matmul")}, timeout_s=590.0),
        Run("dsl", kwargs={"workloads": ("gluon_gemm", "cute_gemm", "fa4_forward", "quack_softmax")}, timeout_s=590.0,
            optional=True),
        Run("peers", kwargs={"workloads": ("jax_triton_matmul", "cutlass_call_gemm")}, timeout_s=590.0,
            optional=True),
        Run(COMPILERS, kwargs={"workloads": (), "compilers": True}, timeout_s=590.0))

WORKLOADS = ("cuda_corpus", "triton_matmul", "gluon_gemm", "cute_gemm", "fa4_forward", "quack_softmax",
             "jax_triton_matmul", "cutlass_call_gemm")
HOPPER_ONLY = ("gluon_gemm", "cute_gemm", "fa4_forward", "cutlass_call_gemm")  # wgmma kernels: sm_90a
PEERS = ("jax_triton_matmul", "cutlass_call_gemm")  # another package's calls: no pack, the cold run alone
PAIRS = 3  # warm and pack processes, alternating
GEMM_N = 4096
MATMUL_SHAPE = (4096, 4096, 4096)

# One child: builds a workload's calls, then either runs them to their first results ("run") or lowers them for
# CUDA ("lower": what the pack is recorded from, on the CPU). Prints its JSON after "CHILD ".
CHILD = r'''
import json, os, sys, time
workload, mode = sys.argv[1], sys.argv[2]
limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
import jax, jax.numpy as jnp
if os.environ.get("JMF_XLA_CACHE"):  # JAX's persistent compilation cache, every program kept
  jax.config.update("jax_compilation_cache_dir", os.environ["JMF_XLA_CACHE"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
if mode == "run":
  jax.block_until_ready(jax.jit(lambda x: x + 1)(jnp.zeros(8)))  # JAX's own start is not the kernels'
from benchmarks import cold_start as bench
prepared = bench.prepare(workload)  # imports (the DSLs, torch for quack): not the kernels' either
import jax_mosaic_ffi as jmf
start = time.perf_counter()
calls = bench.calls(workload, prepared, limit)
out = {}
if mode == "run":
  # The kernels' part (the calls built, each step traced and lowered) and XLA's (the lowered program compiled).
  kernels_s, xla_s = time.perf_counter() - start, 0.0
  for fn, inputs in calls:
    t0 = time.perf_counter()
    lowered = jax.jit(fn).lower(*inputs)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    kernels_s, xla_s = kernels_s + t1 - t0, xla_s + t2 - t1
    jax.block_until_ready(compiled(*inputs))
  out["first_result_s"] = time.perf_counter() - start
  out.update(kernels_s=kernels_s, xla_compile_s=xla_s)
  if os.environ.get("JMF_SAVE_TUNING"):
    jmf.save_tuning(os.environ["JMF_SAVE_TUNING"])
else:
  for fn, inputs in calls:
    avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
    jax.jit(fn).trace(*avals).lower(lowering_platforms=("cuda",))
s = jmf.kernel_cache_stats()
out.update(calls=len(calls), compiles=sum(s.compiles.values()), pack_hits=s.pack_hits,
           disk_hits=s.disk_hits, tunings=s.autotune_tunings, autotune_pack_hits=s.autotune_pack_hits)
print("CHILD " + json.dumps(out), flush=True)
'''


def prepare(workload: str):
  """The workload's kernel module(s), imported; raises ImportError where they cannot be (reported as n/a)."""
  if workload == "cuda_corpus":
    from benchmarks.kernels import cuda_corpus
    return cuda_corpus
  if workload == "triton_matmul":
    from benchmarks import autotune
    return autotune
  if workload == "gluon_gemm":
    from benchmarks.kernels import gluon_user
    from triton.experimental.gluon import language as gl
    return gluon_user, gl
  if workload == "cute_gemm":
    from benchmarks.kernels import cute_gemm
    return cute_gemm
  if workload == "fa4_forward":
    from benchmarks.kernels import fa4_user
    return fa4_user
  if workload == "quack_softmax":
    import quack.softmax_jax  # noqa: F401  (the installed quack: what the workload stands for)
    from benchmarks.kernels import quack_user
    return quack_user
  if workload == "jax_triton_matmul":
    import jax_triton
    from benchmarks import autotune
    return autotune, jax_triton
  if workload == "cutlass_call_gemm":
    import cutlass.jax as cjax
    from benchmarks.kernels import cute_gemm
    return cute_gemm, cjax
  raise ValueError(f"no workload {workload!r}; there are {', '.join(WORKLOADS)}")


def calls(workload: str, prepared, limit: int | None = None) -> list:
  """[(function, inputs)] of the workload: making them compiles the kernels (or takes them from a cache)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import jax_mosaic_ffi as jmf
  rng = np.random.default_rng(0)
  if workload == "cuda_corpus":
    corpus = prepared
    return [(case.call(corpus.compile_case(case)), case.inputs(rng)) for case in corpus.CASES[:limit]]
  if workload == "triton_matmul":
    autotune = prepared
    tuned = jmf.autotune(autotune.triton_factory(), configs=autotune.TRITON_CONFIGS, name="bench-cold-start-matmul")
    m, n, k = MATMUL_SHAPE
    return [(tuned, [rng.standard_normal(s, dtype=np.float32).astype(np.float16) for s in ((m, k), (k, n))])]
  if workload == "gluon_gemm":
    K, gl = prepared
    bm, bn, bk = (K.GEMM_TILE[key] for key in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    layouts = [gl.NVMMASharedLayout.get_default_for(b, gl.float16) for b in ([bm, bk], [bk, bn], [bm, bn])]
    TD = jmf.TensorDescriptor
    gemm = jmf.mosaic_kernel(
        jmf.gluon_kernel(K.matmul_pipelined, constexprs={"MMAImpl": K.WGMMA, "num_buffers": K.GEMM_BUFFERS},
                         num_warps=K.GEMM_WARPS),
        lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float16),
        grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], bm), jmf.cdiv(b.shape[1], bn)),
        param_order=(TD.from_tensor("in0", [bm, bk], layout=layouts[0]),
                     TD.from_tensor("in1", [bk, bn], layout=layouts[1]),
                     TD.from_tensor("out0", [bm, bn], layout=layouts[2])))
    return [(gemm, [rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32).astype(np.float16) for _ in "ab"])]
  if workload == "cute_gemm":
    out = jax.ShapeDtypeStruct((GEMM_N, GEMM_N), jnp.bfloat16)
    gemm = jmf.cute_call(prepared.hopper_gemm, output_shape_dtype=out, use_static_tensors=True)
    return [(gemm, [rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32).astype(jnp.bfloat16) for _ in "ab"])]
  if workload == "fa4_forward":
    q, k, v = (rng.standard_normal((2, 2048, 16, 128), dtype=np.float32).astype(jnp.bfloat16) for _ in range(3))
    return [(lambda q, k, v: prepared.flash_attention(q, k, v, causal=True), [q, k, v])]
  if workload == "jax_triton_matmul":  # each config compiled, as the autotuned call builds them all
    autotune, jt = prepared
    return [autotune.jax_triton_call(jt, config) for config in autotune.TRITON_CONFIGS[:limit]]
  if workload == "cutlass_call_gemm":
    cute_gemm, cjax = prepared
    out = jax.ShapeDtypeStruct((GEMM_N, GEMM_N), jnp.bfloat16)
    gemm = cjax.cutlass_call(cute_gemm.hopper_gemm, output_shape_dtype=out, use_static_tensors=True)
    return [(gemm, [rng.standard_normal((GEMM_N, GEMM_N), dtype=np.float32).astype(jnp.bfloat16) for _ in "ab"])]
  x = rng.standard_normal((4096, 4096), dtype=np.float32)
  return [(prepared.softmax_forward, [x])]


def child(workload: str, mode: str, env: dict, limit: int | None = None) -> dict:
  """The workload run ("run") or lowered for CUDA ("lower") in a fresh process: its counters (and time)."""
  args = [workload, mode] + ([str(limit)] if limit is not None else [])
  return json_child(CHILD, args, env, 400, tail=4000)


def record_pack(workload: str, arch: str, tuning: str | None, out: str, env: dict, limit: int | None = None) -> str:
  """Records the workload's pack for ``arch`` (on the CPU: the record command's children lower it); its listing."""
  command = [sys.executable, "-m", "jax_mosaic_ffi.pack", "record", out, "--arch", arch]
  command += ["--tuning", tuning] if tuning else []
  # The repository reaches the child alone, not the record command: with an installed wheel the source tree's
  # jax_mosaic_ffi (no extension built in it) would shadow the installed one (benchmarks/__init__.py takes it off
  # the path again once the child has imported the benchmarks).
  child_code = f"import sys\nsys.path.insert(0, {REPO!r})\n{CHILD}"
  command += ["--", sys.executable, "-c", child_code, workload, "lower"] + ([str(limit)] if limit is not None else [])
  environment = {**os.environ, **env}
  done = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=400,
                        cwd=tempfile.gettempdir())
  if done.returncode != 0:
    raise RuntimeError(f"recording the pack failed (exit code {done.returncode}):\n{done.stderr[-3000:]}")
  return done.stdout


def measure(workload: str, arch: str, root: str) -> dict:
  """The workload's cold, warm and packed runs; every folder they use is made below ``root``."""
  fresh = lambda prefix: tempfile.mkdtemp(prefix=f"{prefix}-", dir=root)  # noqa: E731
  tuning = os.path.join(fresh("tuning"), "tuning.json")
  cache, xla_cache = fresh("cache"), fresh("xla")
  cold = child(workload, "run", {"JAX_MOSAIC_FFI_CACHE_DIR": cache, "TRITON_CACHE_DIR": fresh("triton"),
                                 "JMF_SAVE_TUNING": tuning, "JMF_XLA_CACHE": xla_cache})
  parts = {"cold_s": cold["first_result_s"], "cold_kernels_s": cold["kernels_s"],
           "cold_xla_s": cold["xla_compile_s"], "calls": cold["calls"], "cold_compiles": cold["compiles"],
           "cold_tunings": cold["tunings"]}
  if workload in PEERS:
    return parts
  os.chmod(tuning, 0o644)
  pack = os.path.join(fresh("pack"), f"{workload}.jmfpack")
  listing = record_pack(workload, arch, tuning if cold["tunings"] else None, pack,
                        {"JAX_MOSAIC_FFI_CACHE_DIR": fresh("record-cache")})
  warm, packed, both = [], [], []
  for _ in range(PAIRS):
    warm.append(child(workload, "run", {"JAX_MOSAIC_FFI_CACHE_DIR": cache}))
    with_pack = {"JAX_MOSAIC_FFI_CACHE_DIR": fresh("empty"), "JAX_MOSAIC_FFI_PACKS": pack,
                 "JAX_MOSAIC_FFI_PACKS_STRICT": "1", "TRITON_CACHE_DIR": fresh("triton")}
    packed.append(child(workload, "run", with_pack))
    both.append(child(workload, "run", {**with_pack, "JAX_MOSAIC_FFI_CACHE_DIR": fresh("empty"),
                                        "JMF_XLA_CACHE": xla_cache}))
  median = lambda runs, key: statistics.median(r[key] for r in runs)  # noqa: E731
  warm_s, pack_s = median(warm, "first_result_s"), median(packed, "first_result_s")
  return {**parts, "warm_s": warm_s, "pack_s": pack_s, "pack_over_warm": pack_s / warm_s,
          "pack_kernels_s": median(packed, "kernels_s"), "pack_xla_s": median(packed, "xla_compile_s"),
          "both_s": median(both, "first_result_s"), "both_xla_s": median(both, "xla_compile_s"),
          "pack_compiles": max(p["compiles"] + p["tunings"] for p in packed + both),
          "pack_hits": packed[0]["pack_hits"], "winners_from_pack": packed[0]["autotune_pack_hits"],
          "pack_bytes": os.path.getsize(pack), "pack_listing": listing.strip().splitlines()[0]}


def run(workloads=WORKLOADS, compilers: bool = False) -> dict:
  """Each of ``workloads`` measured (`measure`); a workload that fails is its row, the others go on. ``compilers``:
  instead, each front end's cold compile against its native compiler's (cold_compile.py)."""
  if compilers:  # no GPU needed
    out = cold_compile.run()
    rows = out["rows"]
    if "nvrtc_small" in rows and "nvrtc_halves" in rows:  # the goal: the slower kernel's ratio
      out["nvrtc_over_alone"] = max(rows[r]["ratio"] for r in ("nvrtc_small", "nvrtc_halves"))
    return out
  from jax_mosaic_ffi.base import gpu_info
  gpus = gpu_info.visible_gpus()
  if not gpus:
    return {"skipped": "needs a GPU"}
  arch = f"sm_{gpus[0].arch}"
  results, errors = {}, {}
  root = tempfile.mkdtemp(prefix="jmf-cold-start-")
  try:
    _measure_all(workloads, gpus[0].arch, arch, root, results, errors)
  finally:
    shutil.rmtree(root, ignore_errors=True)
  measured = [r for r in results.values() if "pack_s" in r]
  out = {"arch": arch, "workloads": results, "errors": errors, "measured": bool(measured)}
  if measured:
    out["pack_over_warm"] = max(r["pack_over_warm"] for r in measured)
    out["pack_compiles"] = sum(r["pack_compiles"] for r in measured)
  return out


def _measure_all(workloads, number: int, arch: str, root: str, results: dict, errors: dict) -> None:
  for workload in workloads:
    if workload in HOPPER_ONLY and number != 90:
      results[workload] = {"skipped": f"a Hopper (sm_90a) kernel; this GPU is {arch}"}
      continue
    try:
      prepare(workload)
    except ImportError as e:
      results[workload] = {"skipped": f"not installed: {last_line(str(e))}"}
      continue
    try:
      results[workload] = measure(workload, arch, root)
    except Exception as e:  # one workload's failure is its row
      errors[workload] = last_line(str(e))


def tables(results: dict) -> list[str]:
  rows, measured = [], None
  compilers = results.get(COMPILERS)
  compiled = [] if compilers is None else [cold_compile.table_of(compilers) if not failure(compilers)
                                           else f"Compilers: n/a: {failure(compilers)}"]
  for run in RUNS:
    if run.name == COMPILERS:
      continue
    r = results.get(run.name)
    why = failure(r)
    if why:
      rows += [[w, "n/a", why[:80], *[""] * (len(_COLUMNS) - 3)] for w in run.kwargs["workloads"]]
    else:
      measured = measured or r
      rows += _rows(r, run.kwargs["workloads"])
  if measured is None:
    return [f"n/a: {failure(results.get('main'))}", *compiled]
  method = (f"Each workload in fresh processes on {measured.get('arch', '?')}, from after its imports and JAX's start "
            "to every call's first result: cold (empty caches: compiles and autotuning), warm disk cache (medians "
            f"of {PAIRS}), and an empty cache with the workload's kernel pack, recorded on the CPU by `python -m "
            "jax_mosaic_ffi.pack record` with the cold run's tuning file, under the strict mode (medians of "
            f"{PAIRS}, alternating with the warm runs), and that again with JAX's persistent compilation cache the "
            "cold run filled. Each time is split into the kernels' part (the calls built, traced and lowered: "
            "compiles, pack or cache hits, autotuning) and XLA's compile of the program. jax-triton (9 configs, one "
            "call each) and cutlass_call do the same work cold; they have no pack.")
  return [method + "\n\n" + table(list(_COLUMNS), rows), *compiled]


_COLUMNS = ("workload", "calls", "cold (kernels + XLA)", "warm disk", "pack (kernels + XLA)", "pack and XLA's cache",
            "pack / warm", "compiled or tuned with the pack")


def _split(total: float, kernels: float, xla: float, digits: int) -> str:
  return f"{fmt(total, digits)} s ({fmt(kernels, digits)} + {fmt(xla, digits)} s)"


def _rows(r: dict, workloads) -> list[list[str]]:
  rows = []
  for workload in workloads:
    w = r["workloads"].get(workload)
    blank = [""] * (len(_COLUMNS) - 3)
    if workload in r.get("errors", {}):
      rows.append([workload, "failed", r["errors"][workload][:80], *blank])
    elif w is None or "skipped" in w:
      rows.append([workload, "n/a", (w or {}).get("skipped", "not run")[:80], *blank])
    else:
      cold = (f"{_split(w['cold_s'], w['cold_kernels_s'], w['cold_xla_s'], 2)}; {w['cold_compiles']} compiles, "
              f"{w['cold_tunings']} tuned")
      if "pack_s" not in w:  # a peer's: its cold run alone
        rows.append([workload, str(w["calls"]), cold, "", "no pack", "", "", ""])
        continue
      rows.append([workload, str(w["calls"]), cold, f"{fmt(w['warm_s'], 3)} s",
                   _split(w["pack_s"], w["pack_kernels_s"], w["pack_xla_s"], 3),
                   f"{fmt(w['both_s'], 3)} s (XLA {fmt(w['both_xla_s'], 3)} s)", f"**{fmt(w['pack_over_warm'])}x**",
                   f"{w['pack_compiles']} ({w['pack_hits']} from the pack, {w['pack_bytes'] // 1024} KiB)"])
  return rows
