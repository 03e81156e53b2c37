"""Launch overhead: per-call time of a trivial kernel in a jitted chain of 200 calls.

One process per setting of XLA's flags (command buffers on/off; PDL at
XLA's default, forced on, forced off), every path of a process timed
interleaved, ratios taken to XLA's own kernel (Pallas on Triton) in the same
process. The default-PDL processes also time the raw driver floors, the
baseline custom calls and the kept-alive variants, and count the collective
target's prepare/initialize stages.
"""

from __future__ import annotations

import os
import traceback

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, ratio, table
from benchmarks.suite import Run

NAME = "launch"
TITLE = "Launch overhead"
ORDER = 10
FIGURE = "launch_overhead.png"

CHAIN = 200
N = 256
ROUNDS = 100
STAGE_EXECUTIONS = 10

# key -> label, in table order. Keys are the results' keys (and goals' paths).
PATHS = {
    "raw_graph": "raw CUDA graph",
    "raw_stream": "raw stream launches",
    "raw_stream_host": "raw stream launches (host wall)",
    "mosaic": "mosaic_kernel",
    "mosaic_kept": "mosaic_kernel, results kept alive",
    "mosaic_pdl": "mosaic_kernel, uses_pdl (kernel starts with griddepcontrol.wait)",
    "mosaic_pdl_early": "mosaic_kernel, uses_pdl + early griddepcontrol.launch_dependents",
    "mosaic_collective": "mosaic_kernel collective target, 1-device clique (jmf.ops.all_reduce)",
    "plain_ffi": "plain jax.ffi launch, execute-only handler (captured)",
    "empty_ffi": "custom call, execute-only empty handler (captured)",
    "xla_triton": "XLA's own kernel (Pallas/Triton)",
    "xla_triton_kept": "XLA's own kernel (Pallas/Triton), results kept alive",
    "xla_fusion": "XLA fusion (x + 1 between optimization barriers)",
    "mosaic_gpu": "mosaic_gpu_v2 (Pallas/Mosaic GPU)",
}
REFERENCE = "xla_triton"  # "XLA's own kernel": every ratio is to it
RAW = ("raw_graph", "raw_stream", "raw_stream_host")
KEPT = {"mosaic": "mosaic_kept", "xla_triton": "xla_triton_kept"}  # timed both ways from one executable
PDL_PATHS = ("mosaic", "mosaic_pdl", "mosaic_pdl_early", "xla_triton", "xla_fusion")

CB_FLAGS = {"on": "", "off": "--xla_gpu_enable_command_buffer="}
# Both flags exist in jaxlib 0.11.2 (both default to true there); a flag XLA
# does not know aborts the process, which then reads as n/a.
PDL_FLAGS = {"default": "", "on": "--xla_gpu_enable_pdl=true --xla_gpu_enable_pdl_launch=true",
             "off": "--xla_gpu_enable_pdl=false --xla_gpu_enable_pdl_launch=false"}


def run_name(command_buffers: str, pdl: str) -> str:
  return f"cb_{command_buffers}" + ("" if pdl == "default" else f"_pdl_{pdl}")


RUNS = tuple(Run(run_name(cb, pdl), kwargs={"command_buffers": cb, "pdl": pdl},
                 xla_flags=f"{CB_FLAGS[cb]} {PDL_FLAGS[pdl]}".strip(), optional=pdl != "default")
             for pdl in PDL_FLAGS for cb in CB_FLAGS)

SOURCE = timing.SPIN_SOURCE + r'''
extern "C" __global__ void add_one(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
// PDL-safe: reads nothing before the previous grid's results are visible.
extern "C" __global__ void add_one_pdl(const float* x, float* y, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
// The same, and lets the next grid launch at once: it waits for our results anyway.
extern "C" __global__ void add_one_pdl_early(const float* x, float* y, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
'''
KERNELS = ("add_one", "add_one_pdl", "add_one_pdl_early")


# ------------------------------------------------------------------ measuring (in the child)

def run(command_buffers: str, pdl: str, rounds: int = ROUNDS) -> dict:
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  full = pdl == "default"
  result = {"command_buffers": command_buffers, "pdl": pdl, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "chain": CHAIN, "rounds": rounds, "us_per_call": {}, "errors": {}}
  kernels = {name: jmf.cuda_kernel(SOURCE, name) for name in KERNELS}
  x = jnp.asarray(np.random.default_rng(0).standard_normal(N).astype(np.float32))  # JAX's backend first
  function = None
  if full:
    try:
      raw, function = _raw_paths(kernels["add_one"], rounds)
      result["us_per_call"].update(raw)
    except Exception:  # the plain jax.ffi path needs the function: it then fails too, and says so
      result["errors"].update({key: traceback.format_exc()[-1500:] for key in RAW})
  calls = {}
  for key, make in _programs(kernels, function, full).items():
    try:
      fn, adds = make()
      jitted = _checked(fn, x, adds)
    except Exception:  # reported, not fatal: the other paths still count
      result["errors"][key] = traceback.format_exc()[-1500:]
      continue
    calls[key] = _dropped(jitted, x)
    if full and key in KEPT:
      calls[KEPT[key]] = _kept(jitted, x)
  seconds = timing.interleaved(calls, rounds)
  result["us_per_call"].update({key: s / CHAIN * 1e6 for key, s in seconds.items()})
  if full:
    result["collective_stages"] = _stage_counts(calls.get("mosaic_collective"))
  result["registration"] = jmf.registration.status()["message"]
  return result


def _programs(kernels, function, full: bool) -> dict:
  """key -> a maker of (function of x to jit, what it adds to x, or None: unchecked)."""
  import jax

  from benchmarks import baselines
  makers = {
      "mosaic": lambda: (_chain(_mosaic(kernels["add_one"])), CHAIN),
      "mosaic_pdl": lambda: (_chain(_mosaic(kernels["add_one_pdl"], uses_pdl=True)), CHAIN),
      "mosaic_pdl_early": lambda: (_chain(_mosaic(kernels["add_one_pdl_early"], uses_pdl=True)), CHAIN),
      "mosaic_collective": lambda: (_collective_chain(), 0),
      "plain_ffi": lambda: (_chain(baselines.plain_ffi(N, _needed(function))), CHAIN),
      "empty_ffi": lambda: (_chain(baselines.empty_ffi(N)), None),
      "xla_triton": lambda: (_chain(_pallas("triton")), CHAIN),
      "xla_fusion": lambda: (_chain(lambda v: jax.lax.optimization_barrier(v + 1.0)), CHAIN),
      "mosaic_gpu": lambda: (_chain(_pallas("mosaic_gpu")), CHAIN),
  }
  keys = makers if full else PDL_PATHS
  return {key: makers[key] for key in keys}


def _needed(function):
  if function is None:
    raise RuntimeError("no CUfunction: the raw driver paths failed")
  return function


def _chain(call, length: int = CHAIN):
  def f(x):
    for _ in range(length):
      x = call(x)
    return x
  return f


def _checked(fn, x, adds):
  """Jits `fn`, runs it once and checks that it really ran its kernels."""
  import jax
  import numpy as np
  jitted = jax.jit(fn)
  out = jitted(x)
  if adds is not None:
    np.testing.assert_allclose(np.asarray(out), np.asarray(x) + adds, rtol=1e-6)
  return jitted


def _dropped(jitted, x):
  """The result dies at once: the allocator hands its address to the next call."""
  return lambda: jitted(x).block_until_ready()


def _kept(jitted, x):
  """The result lives until the next call has its own, so outputs alternate
  between two addresses and XLA must update its command buffer every time."""
  held = []

  def call():
    out = jitted(x).block_until_ready()
    held[:] = [out]
  return call


def _mosaic(kernel, uses_pdl: bool = False):
  import jax
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  return jmf.mosaic_kernel(kernel, jax.ShapeDtypeStruct((N,), jnp.float32), grid=1, block=N,
                           scalars=(np.int32(N),), uses_pdl=uses_pdl)


def _collective_chain():
  """The chain through the collective target: all_reduce over one device is the identity."""
  import functools

  import jax
  import numpy as np
  from jax.sharding import Mesh, PartitionSpec as P

  import jax_mosaic_ffi as jmf
  mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
  body = _chain(functools.partial(jmf.ops.all_reduce, axis_name="x"))
  return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))


def _pallas(backend: str):
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


def _raw_paths(kernel, rounds: int) -> tuple[dict, object]:
  """Our kernel's cubin through the driver directly: stream launches and a graph."""
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
  us = {"raw_stream": stream_s, "raw_stream_host": host_s, "raw_graph": graph_s}
  return {key: s / CHAIN * 1e6 for key, s in us.items()}, add_one


def _stage_counts(call, executions: int = STAGE_EXECUTIONS) -> dict:
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


# ------------------------------------------------------------------ rendering (in the parent, no jax)

METHOD = (
    f"A trivial kernel ({N} floats, +1) called {CHAIN} times in one jitted function; per call: host wall time of "
    f"the whole call over {CHAIN}, median of {ROUNDS} rounds with every path of the process interleaved, and the "
    "ratio to XLA's own kernel (Pallas on Triton) in the same process. The raw rows launch the same cubin through "
    "the driver, timed on the GPU behind a spin kernel (the floor) or, \"host wall\", on the host; \"kept alive\" "
    "holds each result until the next call, so the output moves and XLA updates its command buffer (otherwise "
    "the allocator hands the same address back); execute-only handlers are stream-captured by XLA into a "
    "child-graph node inside command buffers, where mosaic_kernel records a kernel node.")
PDL_METHOD = (
    "The launch-parity paths again, each column a process of its own with XLA's flags `--xla_gpu_enable_pdl` and "
    "`--xla_gpu_enable_pdl_launch` left at XLA's default, both true, or both false: us per call and, in "
    "parentheses, the ratio to XLA's own kernel (Pallas on Triton) in that process. Our PDL kernels start with "
    "`griddepcontrol.wait`; \"early\" issues `griddepcontrol.launch_dependents` right after it.")
STAGES_METHOD = (
    f"`jmf.ops.all_reduce` over a one-device mesh (`shard_map`), chained {CHAIN} times: per-call time as above, "
    f"and the prepare and initialize stages XLA ran, counted by `kernel_cache_stats()` over {STAGE_EXECUTIONS} "
    "executions: per execution of the chain and, in parentheses, per call site and execution.")


def tables(results: dict) -> list[str]:
  return [_main_table(results), "### XLA's PDL flags\n\n" + _pdl_table(results),
          "### Collective target: stages per execution\n\n" + _stages_table(results)]


def _us(run, key):
  return (run or {}).get("us_per_call", {}).get(key)


def _notes(runs: dict) -> list[str]:
  """A line per failed run and per failed path; `runs` maps a description to a run's results."""
  lines = []
  for described, run in runs.items():
    why = failure(run)
    if why:
      lines.append(f"- {described}: n/a: {why}")
    for key, error in (run or {}).get("errors", {}).items():
      lines.append(f"- {PATHS.get(key, key)} ({described}): n/a: {last_line(error)}")
  return lines


def _main_table(results: dict) -> str:
  runs = {cb: results.get(run_name(cb, "default")) for cb in CB_FLAGS}
  rows = []
  for key, label in PATHS.items():
    us = [_us(runs[cb], key) for cb in CB_FLAGS]
    ratios = [ratio(_us(runs[cb], key), _us(runs[cb], REFERENCE)) for cb in CB_FLAGS]
    rows.append([label, *map(fmt, us), *map(fmt, ratios)])
  header = ["path", "command buffers on (us/call)", "off (us/call)", "on / XLA's kernel", "off / XLA's kernel"]
  notes = _notes({f"command buffers {cb}": run for cb, run in runs.items()})
  registration = next((r["registration"] for r in runs.values() if r and "registration" in r), None)
  text = METHOD + "\n\n" + table(header, rows)
  text += ("\n\n" + "\n".join(notes)) if notes else ""
  return text + (f"\n\nRegistration: {registration}" if registration else "")


def _pdl_cell(run, key) -> str:
  us = _us(run, key)
  r = ratio(us, _us(run, REFERENCE))
  return "n/a" if us is None else fmt(us) + (f" ({fmt(r)}x)" if r is not None else "")


def _pdl_table(results: dict) -> str:
  columns = [(cb, pdl) for cb in CB_FLAGS for pdl in PDL_FLAGS]
  header = ["path"] + [f"cb {cb}, PDL {pdl}" for cb, pdl in columns]
  rows = [[PATHS[key]] + [_pdl_cell(results.get(run_name(cb, pdl)), key) for cb, pdl in columns]
          for key in PDL_PATHS]
  notes = _notes({f"command buffers {cb}, XLA PDL flags {pdl}": results.get(run_name(cb, pdl))
                  for cb, pdl in columns if pdl != "default"})  # the default runs' notes are above
  return PDL_METHOD + "\n\n" + table(header, rows) + ("\n\n" + "\n".join(notes) if notes else "")


def _stages_table(results: dict) -> str:
  rows, notes = [], []
  for cb in CB_FLAGS:
    run = results.get(run_name(cb, "default"))
    stages = (run or {}).get("collective_stages", {})
    sites = stages.get("call_sites")
    cells = [f"{fmt(stages.get(k), 0)} ({fmt(ratio(stages.get(k), sites))})" if k in stages else "n/a"
             for k in ("prepares_per_execution", "initializes_per_execution")]
    rows.append([f"command buffers {cb}", fmt(_us(run, "mosaic_collective")), fmt(_us(run, "mosaic")), *cells])
    if "n/a" in stages:
      notes.append(f"- command buffers {cb}: counts n/a: {stages['n/a']}")
  header = ["setting", "collective (us/call)", "plain target (us/call)", "prepare runs", "initialize runs"]
  return STAGES_METHOD + "\n\n" + table(header, rows) + ("\n\n" + "\n".join(notes) if notes else "")


def figure(results: dict, path: str) -> bool:
  """A bar chart of the main table; False where matplotlib is missing or nothing was measured."""
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  on, off = (results.get(run_name(cb, "default")) for cb in CB_FLAGS)
  keys = [k for k in PATHS if _us(on, k) is not None or _us(off, k) is not None]
  if not keys:
    return False
  fig, ax = plt.subplots(figsize=(10, 6))
  y = range(len(keys))
  ax.barh([i - 0.2 for i in y], [_us(on, k) or 0 for k in keys], height=0.4, label="command buffers on")
  ax.barh([i + 0.2 for i in y], [_us(off, k) or 0 for k in keys], height=0.4, label="command buffers off")
  ax.set_yticks(list(y), [PATHS[k] for k in keys], fontsize=7)
  ax.invert_yaxis()
  ax.set_xlabel(f"microseconds per call (trivial kernel, chain of {CHAIN} in one jit)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True
