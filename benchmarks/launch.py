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

from benchmarks import launch_paths as paths
from benchmarks import timing
from benchmarks.launch_paths import CHAIN, N, STAGE_EXECUTIONS
from benchmarks.markdown import failure, fmt, last_line, ratio, table
from benchmarks.suite import Run

NAME = "launch"
TITLE = "Launch overhead"
ORDER = 10
FIGURE = "launch_overhead.png"

ROUNDS = 100

# key -> label, in table order. Keys are the results' keys (and goals' paths).
PATHS = {
    "raw_graph": "raw CUDA graph",
    "raw_graph_pdl": "raw CUDA graph, PDL edges (the kernel as mosaic_kernel instruments it)",
    "raw_stream": "raw stream launches",
    "raw_stream_host": "raw stream launches (host wall)",
    "mosaic": "mosaic_kernel (PDL by default: wait, then launch_dependents, at entry)",
    "mosaic_kept": "mosaic_kernel, results kept alive",
    "mosaic_no_pdl": "mosaic_kernel, uses_pdl=False (the kernel as written)",
    "mosaic_pdl": "mosaic_kernel, PDL, kernel starts with griddepcontrol.wait only",
    "mosaic_pdl_early": "mosaic_kernel, PDL, hand-written wait + early launch_dependents",
    "mosaic_collective": "mosaic_kernel collective target, 1-device clique (jmf.ops.all_reduce)",
    "plain_ffi": "plain jax.ffi launch, execute-only handler (captured)",
    "empty_ffi": "custom call, execute-only empty handler (captured)",
    "xla_triton": "XLA's own kernel (Pallas/Triton)",
    "xla_triton_kept": "XLA's own kernel (Pallas/Triton), results kept alive",
    "xla_fusion": "XLA fusion (x + 1 between optimization barriers)",
    "mosaic_gpu": "mosaic_gpu_v2 (Pallas/Mosaic GPU)",
}
REFERENCE = "xla_triton"  # "XLA's own kernel": every ratio is to it
RAW = ("raw_graph", "raw_graph_pdl", "raw_stream", "raw_stream_host")
KEPT = {"mosaic": "mosaic_kept", "xla_triton": "xla_triton_kept"}  # timed both ways from one executable
PDL_PATHS = ("mosaic", "mosaic_no_pdl", "mosaic_pdl", "mosaic_pdl_early", "xla_triton", "xla_fusion")

CB_FLAGS = {"on": "", "off": "--xla_gpu_enable_command_buffer="}
# Both flags exist in jaxlib 0.11.2 (both default to true there); a flag XLA
# does not know aborts the process, which then reads as n/a.
PDL_FLAGS = {"default": "", "on": "--xla_gpu_enable_pdl=true --xla_gpu_enable_pdl_launch=true",
             "off": "--xla_gpu_enable_pdl=false --xla_gpu_enable_pdl_launch=false"}


def run_name(command_buffers: str, pdl: str) -> str:
  return f"cb_{command_buffers}" + ("" if pdl == "default" else f"_pdl_{pdl}")


RUNS = tuple(Run(run_name(cb, pdl), kwargs={"command_buffers": cb, "pdl": pdl},
                 xla_flags=f"{CB_FLAGS[cb]} {PDL_FLAGS[pdl]}".strip(), optional=pdl != "default")
             for pdl in PDL_FLAGS for cb in CB_FLAGS) + (
    # XLA's own host time per execution, by phase, from its verbose log (xla_phases.py).
    Run("cb_on_phases", kwargs={"command_buffers": "on", "pdl": "default", "phases": True}, optional=True),)
# The paths whose GPU time is stamped (GPU clock before and after the chain),
# and those whose host phases are read from XLA's log.
GPU_PATHS = ("mosaic", "mosaic_no_pdl", "xla_triton")
PHASE_PATHS = ("xla_triton", "mosaic", "empty_ffi")

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
// Passes x through and writes the GPU clock (ns) to t. Compiled PDL-safe, so it
// reads the clock only once the previous kernel's results are complete.
extern "C" __global__ void stamp(const float* x, float* y, unsigned int* t, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i];
  if (i == 0) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    t[0] = (unsigned int)now;
    t[1] = (unsigned int)(now >> 32);
  }
}
'''
KERNELS = ("add_one", "add_one_pdl", "add_one_pdl_early", "stamp")  # add_one as written is compiled too (pdl=False)


# ------------------------------------------------------------------ measuring (in the child)

def run(command_buffers: str, pdl: str, rounds: int = ROUNDS, phases: bool = False) -> dict:
  if phases:  # before jax is imported: XLA reads its log level once
    return _phases()
  import jax.numpy as jnp
  import numpy as np

  import jax_mosaic_ffi as jmf
  full = pdl == "default"
  result = {"command_buffers": command_buffers, "pdl": pdl, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "chain": CHAIN, "rounds": rounds, "us_per_call": {}, "errors": {}}
  kernels = {name: jmf.cuda_kernel(SOURCE, name) for name in KERNELS}
  kernels["add_one_as_written"] = jmf.cuda_kernel(SOURCE, "add_one", pdl=False)
  x = jnp.asarray(np.random.default_rng(0).standard_normal(N).astype(np.float32))  # JAX's backend first
  function = None
  if full:
    try:
      raw, function = paths.raw_paths(kernels["add_one_as_written"], kernels["add_one"], rounds)
      result["us_per_call"].update(raw)
    except Exception:  # the plain jax.ffi path needs the function: it then fails too, and says so
      result["errors"].update({key: traceback.format_exc()[-1500:] for key in RAW})
  calls, jitted_by_key = {}, {}
  programs = _programs(kernels, function, full)
  for key, make in programs.items():
    try:
      fn, adds = make()
      jitted = paths.checked(fn, x, adds)
    except Exception:  # reported, not fatal: the other paths still count
      result["errors"][key] = traceback.format_exc()[-1500:]
      continue
    calls[key], jitted_by_key[key] = paths.dropped(jitted, x), jitted
    if full and key in KEPT:
      calls[KEPT[key]] = paths.kept(jitted, x)
  seconds = timing.interleaved(calls, rounds)
  result["us_per_call"].update({key: s / CHAIN * 1e6 for key, s in seconds.items()})
  if full:
    result["output_addresses"] = {key: {"dropped": paths.distinct_outputs(j, x, keep=False),
                                        "kept": paths.distinct_outputs(j, x, keep=True)}
                                  for key, j in jitted_by_key.items() if key in KEPT}
    result["collective_stages"] = paths.stage_counts(calls.get("mosaic_collective"))
    stamp = paths.stamp(kernels["stamp"])
    result["gpu_us_per_call"] = {}
    for key in GPU_PATHS:
      try:
        result["gpu_us_per_call"][key] = paths.gpu_us_per_call(programs[key]()[0], stamp, x)
      except Exception:
        result.setdefault("gpu_errors", {})[key] = traceback.format_exc()[-1500:]
  result["registration"] = jmf.registration.status()["message"]
  return result


def _phases() -> dict:
  import functools

  from benchmarks import xla_phases

  @functools.cache
  def setup():  # on first use, inside measure(): jax must not be imported before it sets the log level
    import jax.numpy as jnp
    import numpy as np

    import jax_mosaic_ffi as jmf
    kernels = {name: jmf.cuda_kernel(SOURCE, name) for name in KERNELS}
    x = jnp.asarray(np.random.default_rng(0).standard_normal(N).astype(np.float32))
    return _programs(kernels, None, True), x

  def program(key):
    def make():
      programs, x = setup()
      fn, adds = programs[key]()
      return paths.dropped(paths.checked(fn, x, adds), x)
    return make
  measured = xla_phases.measure({key: program(key) for key in PHASE_PATHS})
  return {"command_buffers": "on", "pdl": "default", "xla_flags": os.environ.get("XLA_FLAGS", ""), "chain": CHAIN,
          "phases_us_per_execution": measured["phases"], "errors": measured["errors"], "us_per_call": {}}


def _programs(kernels, function, full: bool) -> dict:
  """key -> a maker of (function of x to jit, what it adds to x, or None: unchecked)."""
  import jax

  from benchmarks import baselines
  makers = {
      "mosaic": lambda: (paths.chain(paths.mosaic(kernels["add_one"])), CHAIN),
      "mosaic_no_pdl": lambda: (paths.chain(paths.mosaic(kernels["add_one_as_written"], uses_pdl=False)), CHAIN),
      "mosaic_pdl": lambda: (paths.chain(paths.mosaic(kernels["add_one_pdl"], uses_pdl=True)), CHAIN),
      "mosaic_pdl_early": lambda: (paths.chain(paths.mosaic(kernels["add_one_pdl_early"], uses_pdl=True)), CHAIN),
      "mosaic_collective": lambda: (paths.collective_chain(), 0),
      "plain_ffi": lambda: (paths.chain(baselines.plain_ffi(N, paths.needed(function))), CHAIN),
      "empty_ffi": lambda: (paths.chain(baselines.empty_ffi(N)), None),
      "xla_triton": lambda: (paths.chain(paths.pallas("triton")), CHAIN),
      "xla_fusion": lambda: (paths.chain(lambda v: jax.lax.optimization_barrier(v + 1.0)), CHAIN),
      "mosaic_gpu": lambda: (paths.chain(paths.pallas("mosaic_gpu")), CHAIN),
  }
  keys = makers if full else PDL_PATHS
  return {key: makers[key] for key in keys}


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
    "parentheses, the ratio to XLA's own kernel (Pallas on Triton) in that process. mosaic_kernel's default "
    "instruments the kernel with `griddepcontrol.wait` then `griddepcontrol.launch_dependents` at entry; the "
    "hand-written rows start with the wait alone, or with both. [launch_parity.md](launch_parity.md) reads "
    "these tables.")
STAGES_METHOD = (
    f"`jmf.ops.all_reduce` over a one-device mesh (`shard_map`), chained {CHAIN} times: per-call time as above, "
    f"and the prepare and initialize stages XLA ran, counted by `kernel_cache_stats()` over {STAGE_EXECUTIONS} "
    "executions: per execution of the chain and, in parentheses, per call site and execution.")


SPLIT_METHOD = (
    f"Where a call's time goes. GPU: the same chain of {CHAIN} calls between two stamp kernels that read the GPU "
    "clock once the kernel before them is done, in the same jitted program; the difference over "
    f"{CHAIN}, median of 30 executions. Host, the rest: wall time per call (the first table) less the GPU "
    "time. XLA's phases come from a process of their own (command buffers on) that logs XLA's own timing "
    "(TF_CPP_MAX_VLOG_LEVEL=3), per execution of the whole chain, median of 200: prepare is from the "
    "execution's streams being set up to its thunks being prepared and initialized; after is from the "
    "thunks' end (the graph launched) to XLA's timing line; XLA host total is XLA's own figure for the "
    "execution. The custom call that launches nothing has no GPU work of its own to stamp.")


def tables(results: dict) -> list[str]:
  return [_main_table(results), "### Where the time goes\n\n" + _split_table(results),
          "### XLA's PDL flags\n\n" + _pdl_table(results),
          "### Collective target: stages per execution\n\n" + _stages_table(results)]


def _split_table(results: dict) -> str:
  on, off = (results.get(run_name(cb, "default")) for cb in CB_FLAGS)
  phases_run = results.get("cb_on_phases")
  phases = (phases_run or {}).get("phases_us_per_execution", {})
  rows = []
  for key in dict.fromkeys(GPU_PATHS + PHASE_PATHS):
    row = [PATHS[key]]
    for run in (on, off):
      wall, gpu = _us(run, key), (run or {}).get("gpu_us_per_call", {}).get(key)
      row += [fmt(wall), fmt(gpu), fmt(wall - gpu if wall is not None and gpu is not None else None)]
    measured = phases.get(key, {})
    row += [fmt(measured.get(k), 1) for k in ("prepare", "after", "xla_total")]
    rows.append(row)
  header = ["path", "cb on: wall (us/call)", "GPU", "host, the rest", "cb off: wall", "GPU", "host, the rest",
            "XLA prepare (us/execution)", "after", "XLA host total"]
  notes = _notes({"XLA's phases": phases_run}) if phases_run is not None else ["- XLA's phases: not run"]
  for key in PHASE_PATHS:
    if phases.get(key, {}).get("executions") == 0:
      notes.append(f"- {PATHS[key]} (XLA's phases): n/a: no XLA timing lines parsed (another jaxlib's log format?)")
  for cb, run in (("on", on), ("off", off)):
    for key, error in (run or {}).get("gpu_errors", {}).items():
      notes.append(f"- GPU stamps of {PATHS.get(key, key)} (command buffers {cb}): n/a: {last_line(error)}")
  graphs = f"Raw CUDA graphs of our cubin: {fmt(_us(on, 'raw_graph'))} us per node with plain edges, " \
           f"{fmt(_us(on, 'raw_graph_pdl'))} us with PDL edges (the instrumented kernel)."
  return SPLIT_METHOD + "\n\n" + table(header, rows) + "\n\n" + graphs + ("\n\n" + "\n".join(notes) if notes else "")


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
  text = METHOD + "\n\n" + table(header, rows) + _addresses_line(runs)
  text += ("\n\n" + "\n".join(notes)) if notes else ""
  return text + (f"\n\nRegistration: {registration}" if registration else "")


def _addresses_line(runs: dict) -> str:
  """What the kept-alive rows rest on: outputs move only when results are kept."""
  parts = [f"{PATHS[key]} with command buffers {cb}: {seen['dropped']} dropped, {seen['kept']} kept"
           for cb, run in runs.items() for key, seen in (run or {}).get("output_addresses", {}).items()]
  return ("\n\nDistinct output addresses over 6 calls: " + "; ".join(parts) + ".") if parts else ""


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
