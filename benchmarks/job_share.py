"""A job's first lowering: N processes under jax.distributed, each with its own empty disk cache, with and without
sharing their compiles and autotuning decisions (store/job_share.py), against one process alone.

Measured on the CPU where lowering compiles (kernels for JAX_MOSAIC_FFI_TARGETS, the GPU's arch or sm_90; autotuned
calls timed on the CPU, JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU=1, their fallbacks run), so it runs on a GPU machine and
off one alike: per workload, one process alone (the baseline of a multi-host job, whose every process has CPUs of its
own); N processes each compiling everything (JAX_MOSAIC_FFI_JOB_SHARE=0: what every job did before); N processes
sharing. Each process is pinned to one CPU of its own where the machine has enough (the one alone too), as each host
of a multi-host job compiles on its own CPUs. Each process is timed from after jax.distributed's start to its last
call lowered; "job wall" is the slowest process's time, "summed" the processes' times added (a waiter's wait
included: not CPU time), "compiles" each process's. The modes alternate round by round; medians.

Workloads, one per front end where installed: cuda (6 corpus CUDA C++ kernels made inside jmf.compile_ahead, then
each call lowered: a program of many kernels), cuda_tuned (one call autotuned over 6 configs, a kernel each),
triton_tuned (a kernel under @triton.autotune with 4 configs), cute (a CuTe DSL kernel). By hand:
`python -m benchmarks --only job_share`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import benchmarks
from benchmarks.markdown import failure, fmt, table
from benchmarks.suite import CHILD_PREFIX, Run

NAME = "job_share"
TITLE = "A job's first lowering: N processes, with and without sharing compiles"
ORDER = 43
PROCESSES = 2
ROUNDS = 3
RUNS = (Run("main", kwargs={"processes": PROCESSES}, timeout_s=590.0),)
WORKLOADS = ("cuda", "cuda_tuned", "triton_tuned", "cute")
MODES = ("alone", "independent", "shared")

# One process of the job: RANK NPROCS PORT WORKLOAD SEED. Prints its JSON after "CHILD ".
CHILD = r'''
import json, os, sys, time
rank, nprocs, port, workload, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
if os.environ.get("JMF_BENCH_CPU"):  # one CPU of its own, as a host of a multi-host job has
  os.sched_setaffinity(0, {int(os.environ["JMF_BENCH_CPU"])})
import jax
jax.config.update("jax_platforms", "cpu")
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=nprocs, process_id=rank)
jax.devices()
from benchmarks import job_share as bench
calls = bench.prepare(workload, seed)
if calls is None:
  print("CHILD " + json.dumps({"skipped": f"{workload}: its package is not installed"}), flush=True)
  os._exit(0)
import jax_mosaic_ffi as jmf
before = jmf.kernel_cache_stats()
start = time.perf_counter()
for call, avals in calls():
  jax.jit(call).trace(*avals).lower(lowering_platforms=("cuda",))
seconds = time.perf_counter() - start
after = jmf.kernel_cache_stats()
out = {"seconds": seconds, "compiles": sum(after.compiles.values()) - sum(before.compiles.values()),
       "peer_hits": after.peer_hits - before.peer_hits, "tunings": after.autotune_tunings}
print("CHILD " + json.dumps(out), flush=True)
from jax._src import distributed
client = distributed.global_state.client
if nprocs > 1:  # process 0 hosts the coordinator: it leaves last
  client.key_value_set(f"bench/done/{rank}", "1")
  if rank == 0:
    for r in range(1, nprocs):
      client.blocking_key_value_get(f"bench/done/{r}", 300_000)
os._exit(0)
'''

SOURCE = r'''
extern "C" __global__ void scaled(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float v = x[i < n ? i : 0];
  for (int k = 0; k < ROUNDS; ++k) v = v * SCALE + 1.0f;
  if (i < n) y[i] = v;
}
'''
N = 4096


def prepare(workload: str, seed: int):
  """() -> [(call, avals)] of ``workload``, its kernels new to every cache (``seed``); None where its front end is
  not installed."""
  import jax
  import numpy as np
  import jax_mosaic_ffi as jmf
  x = jax.ShapeDtypeStruct((N,), np.float32)

  def cuda_call(k: int, block: int = 256):
    kernel = jmf.cuda_kernel(SOURCE, "scaled", options=[f"-DROUNDS={k + 1}", f"-DSCALE={seed % 997 + 1}.0f"])
    return jmf.mosaic_kernel(kernel, lambda x: x, grid=lambda x: jmf.cdiv(x.size, block), block=block,
                             scalars=lambda x: (np.int32(x.size),), fallback=lambda x: x + k)

  if workload == "cuda":
    return lambda: _corpus_program(seed)
  if workload == "cuda_tuned":
    tuned = jmf.autotune(lambda meta: cuda_call(meta["k"], meta["block"]),
                         configs=[{"k": k, "block": 64 << (k % 3)} for k in range(6)], name="bench-job-share")
    return lambda: [(tuned, (x,))]
  if workload == "triton_tuned":
    try:
      import triton
      import triton.language as tl
    except ImportError:
      return None

    @triton.autotune(configs=[triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 4), (256, 4), (512, 8),
                                                                                        (1024, 8))], key=["n"])
    @triton.jit
    def add_scaled(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
      i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
      mask = i < n
      tl.store(out_ptr + i, tl.load(x_ptr + i, mask=mask) * 2.0, mask=mask)  # new to each job's own caches

    call = jmf.mosaic_kernel(jmf.triton_kernel(add_scaled), lambda x: x,
                             grid=lambda meta, x: jmf.cdiv(x.size, meta["BLOCK"]),
                             scalars=lambda meta, x: (np.int32(x.size),), fallback=lambda x: x * 2.0)
    return lambda: [(call, (x,))]
  if workload == "cute":
    try:
      from benchmarks.kernels import cute_elementwise  # the CuTe DSL's: not importable without it
    except ImportError:
      return None
    return lambda: [(jmf.mosaic_kernel(jmf.cute_kernel(cute_elementwise.add_one), lambda x: x,
                                       fallback=lambda x: x + 1), (x,))]
  raise ValueError(f"no workload {workload!r}")


def _corpus_program(seed: int) -> list:
  """The cold-compile program's six corpus kernels (benchmarks/cold_compile.py's PROGRAM), new to every cache, made
  inside jmf.compile_ahead: [(call, avals)]."""
  import jax
  import numpy as np
  import jax_mosaic_ffi as jmf
  from benchmarks import cold_compile
  from benchmarks.kernels import cuda_corpus
  cases = [next(c for c in cuda_corpus.CASES if c.name == name) for name in cold_compile.PROGRAM]
  rng = np.random.default_rng(0)
  with jmf.compile_ahead():
    kernels = [jmf.cuda_kernel(f"{cuda_corpus.source_of(case)}\n// job {seed}\n", case.name) for case in cases]
  return [(case.call(kernel), [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in case.inputs(rng)])
          for case, kernel in zip(cases, kernels)]


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _job(workload: str, processes: int, share: bool, seed: int) -> list[dict]:
  """Each process's outcome, by rank."""
  import json
  port, root = _port(), tempfile.mkdtemp(prefix="jmf-job-share-bench-")
  targets = os.environ.get("JAX_MOSAIC_FFI_TARGETS") or _arch()
  children = []
  for rank in range(processes):
    env = {**os.environ, "JAX_MOSAIC_FFI_CACHE_DIR": os.path.join(root, f"rank{rank}"),
           "TRITON_CACHE_DIR": os.path.join(root, f"triton{rank}"), "JAX_MOSAIC_FFI_TARGETS": targets,
           "JAX_MOSAIC_FFI_AUTOTUNE_ON_CPU": "1", "JAX_MOSAIC_FFI_JOB_SHARE": "1" if share else "0",
           **({"JMF_BENCH_CPU": str(rank)} if processes <= len(os.sched_getaffinity(0)) else {}),
           "PYTHONPATH": os.pathsep.join(p for p in (benchmarks.REPO, os.environ.get("PYTHONPATH")) if p)}
    children.append(subprocess.Popen([sys.executable, "-c", CHILD, str(rank), str(processes), str(port), workload,
                                      str(seed)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=tempfile.gettempdir()))
  outcomes = []
  try:
    for child in children:
      out, err = child.communicate(timeout=400)
      lines = [line for line in out.splitlines() if line.startswith(CHILD_PREFIX)]
      # Its line, not its exit code: a rank may be stopped by jax.distributed once process 0 (the coordinator's
      # host) left, after it reported.
      if not lines:
        raise RuntimeError(f"exit code {child.returncode}\n{err.strip()[-1500:]}")
      outcomes.append(json.loads(lines[-1][len(CHILD_PREFIX):]))
  finally:
    for child in children:
      if child.poll() is None:
        child.kill()
        child.wait()
  return outcomes


def _arch() -> str:
  from jax_mosaic_ffi.base import gpu_info
  gpus = gpu_info.visible_gpus()
  return f"sm_{gpus[0].arch}" if gpus else "sm_90"


def run(processes: int = PROCESSES) -> dict:
  from benchmarks import machine
  results, seed = {}, int.from_bytes(os.urandom(4), "little")
  for workload in WORKLOADS:
    rounds: dict[str, list] = {mode: [] for mode in MODES}
    try:
      for index in range(ROUNDS):
        for mode in MODES if index % 2 == 0 else MODES[::-1]:
          seed += 1  # every job's kernels new to every cache
          outcomes = _job(workload, 1 if mode == "alone" else processes, mode == "shared", seed)
          if any("skipped" in o for o in outcomes):
            raise LookupError(outcomes[0]["skipped"])
          rounds[mode].append(outcomes)
      rows = {}
      for mode, jobs in rounds.items():
        walls = [max(o["seconds"] for o in job) for job in jobs]
        median = jobs[walls.index(sorted(walls)[len(walls) // 2])]  # the median job, whole
        rows[mode] = {"wall_s": max(o["seconds"] for o in median), "process_s": sum(o["seconds"] for o in median),
                      "compiles": sum(o["compiles"] for o in median), "per_rank": [o["compiles"] for o in median],
                      "peer_hits": sum(o["peer_hits"] for o in median),
                      "tunings": sum(o["tunings"] for o in median), "walls": walls}
      rows["median_of"] = ROUNDS
    except LookupError as e:
      rows = {"skipped": str(e)}
    except Exception as e:  # noqa: BLE001 - this workload's row says why
      rows = {"error": f"{type(e).__name__}: {str(e)[-800:]}"}
    results[workload] = rows
  return {"processes": processes, "workloads": results, "capacity": machine.parallel_capacity(),
          "pinned": processes <= len(os.sched_getaffinity(0)),
          "measured": any("shared" in rows for rows in results.values())}


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  rows = []
  for workload, found in r["workloads"].items():
    if "shared" not in found:
      why = " ".join(str(found.get("skipped") or found.get("error", "?")).split()).replace("|", "/")
      rows.append([workload, f"n/a: {why[:200]}", "", "", "", "", ""])
      continue
    cells = [f"{fmt(found[m]['wall_s'], 2)} / {fmt(found[m]['process_s'], 2)} s, "
             f"{'+'.join(str(c) for c in found[m].get('per_rank', [found[m]['compiles']]))} compiles" for m in MODES]
    rows.append([workload, *cells, f"**{fmt(found['shared']['wall_s'] / found['alone']['wall_s'], 2)}x**",
                 f"{fmt(found['shared']['wall_s'] / found['independent']['wall_s'], 2)}x"])
  n = r["processes"]
  capacity = r.get("capacity")
  method = (f"{n} processes under jax.distributed on one machine (and one process alone), each with its own empty "
            "disk cache, lowering every call for CUDA on the CPU (kernels compile; autotuned calls time their configs "
            "on the CPU)" + (", each process pinned to one CPU of its own (the one alone too): a multi-host job's "
                             "processes each compile on their own CPUs" if r.get("pinned") else "")
            + ". Each cell: the job's wall (its slowest process) / the processes' times added (waits included), and "
            "each process's compiles. `independent`: JAX_MOSAIC_FFI_JOB_SHARE=0. The modes alternate round by round; "
            "the median job of each. Goal: a 2-process job's cuda kernels ready in at most 0.75x one process alone"
            + (f". The CPUs' work the machine gave a run then: {fmt(capacity, 2)} (two busy processes at once against "
               "one; the machine is shared with other users, whose load the ratios carry)" if capacity else "") + ".")
  return [method + "\n\n" + table(["workload", "one process alone", f"{n} independent", f"{n} sharing",
                                   "wall: sharing / alone", "wall: sharing / independent"], rows)]
