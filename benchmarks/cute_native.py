"""CuTe DSL kernels as users write them: through our runtime and through the DSL's own launchers, in one process.

The kernels (kernels/cute_*.py) are `@cute.jit` launchers with the signature `cutlass_call` takes. Each runs, on
the same inputs, through:

- the DSL's own launcher: `cute.compile`'s function called on torch tensors (`from_dlpack`), GPU time between two
  CUDA events on torch's stream behind a sleep kernel, so that the host's launch speed does not count;
- `cutlass.jax.cutlass_call` inside `jax.jit`, and ours, `jmf.cute_call` (same signature) inside `jax.jit`: GPU time
  between two GPU clock stamps inside the jitted program (jax_mosaic_ffi.transforms.gpu_clock);
- for the GEMM, cuBLAS through XLA's `jnp.matmul(a, b.T)`, timed the same way.

Each side computes a chain of calls, each fed by the previous one's output (the same chain everywhere, so caches see
the same traffic), every path checked against a reference first; medians of interleaved rounds. All three CuTe
paths compile the same specialization (static shapes: `use_static_tensors=True`, as `from_dlpack` tensors come).

The launch run measures the host cost per call inside `jit` of a trivial kernel (add_one on 256 floats) in a
chain of 200: ours against cutlass_call (and a CUDA C++ mosaic_kernel for reference), command buffers on and off.
The warm-start run measures the first GEMM result (8192^3 bf16) in fresh processes: cold (empty caches) and warm
(the same cache folders again), ours and cutlass_call, and ours with JAX's persistent compilation cache on too; the
DSL's own file cache is pointed at the same folders. Each process stamps its stages (imports, trace, lowering, XLA's
compile with our instantiate stage inside it, the first execution), so the page shows whose the time is.
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, sig, table
from benchmarks.suite import Run, json_child

NAME = "cute_native"
TITLE = "CuTe DSL kernels as users write them: our runtime against the DSL's own launchers"
ORDER = 58
RUNS = (Run("rowwise", kwargs={"cases": ("axpy", "rmsnorm")}, timeout_s=240),
        Run("gemm", kwargs={"cases": ("gemm_4096", "gemm_4096_cluster2", "gemm_8192", "gemm_8192_cluster2")},
            timeout_s=450),
        Run("launch", kwargs={"launch": True}, timeout_s=150),
        Run("launch_cb_off", kwargs={"launch": True}, xla_flags="--xla_gpu_enable_command_buffer=", timeout_s=150),
        Run("warm_start", kwargs={"warm_start": True}, timeout_s=500))

KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")
ROUNDS = 15
LAUNCH_CHAIN = 200
LAUNCH_N = 256
SLEEP_CYCLES = 20_000_000  # ~10 ms at the H200's clock: longer than the host takes to enqueue a chain
WARM_START_SIZE = 8192
WARM_START_PAIRS = 2

CASES = {
    "axpy": "axpy (0.5 x + y), 16384x8192 bf16",
    "rmsnorm": "RMSNorm over rows, 16384x8192 bf16",
    "gemm_4096": "Hopper GEMM 4096^3 bf16, 128x256 tiles",
    "gemm_4096_cluster2": "Hopper GEMM 4096^3 bf16, 128x256 tiles, 2-CTA clusters (B multicast)",
    "gemm_8192": "Hopper GEMM 8192^3 bf16, 128x256 tiles",
    "gemm_8192_cluster2": "Hopper GEMM 8192^3 bf16, 128x256 tiles, 2-CTA clusters (B multicast)",
}
PATHS = ("dsl", "cutlass_call", "ours", "cublas")


# ------------------------------------------------------------------ the kernels and their cases (in the child)

def environment(with_torch: bool = True) -> dict:
  """The modules the cases need (torch only to measure); raises ImportError naming what is missing."""
  import cuda.bindings.driver as cuda
  import cutlass
  import cutlass.cute as cute
  import cutlass.jax as cjax
  import jax
  import jax.numpy as jnp
  import numpy as np
  from cutlass.cute.runtime import from_dlpack

  import jax_mosaic_ffi as jmf
  torch = None
  if with_torch:
    import torch
  from benchmarks.kernels import cute_elementwise
  from benchmarks.kernels import cute_gemm
  from benchmarks.kernels import cute_rmsnorm
  return {"np": np, "jax": jax, "jnp": jnp, "jmf": jmf, "torch": torch, "cuda": cuda, "cutlass": cutlass,
          "cute": cute, "cjax": cjax, "from_dlpack": from_dlpack, "ew": cute_elementwise, "gemm": cute_gemm,
          "norm": cute_rmsnorm}


def max_clusters(env, cluster_m: int) -> int:
  """How many clusters of cluster_m CTAs of the GEMM can be resident at once (0: let the kernel assume 132 SMs)."""
  try:
    return int(env["cutlass"].utils.HardwareInfo().get_max_active_clusters(cluster_m))
  except Exception:  # an older DSL, or no current context: the kernel's default
    return 0


def make_case(name: str, env: dict) -> dict:
  """One kernel: its launcher and constexprs, the avals of its inputs and output, `inputs()` (numpy, made only
  when measured), the chain's carry, the reference, the work per call and its unit."""
  np, jax, jnp = env["np"], env["jax"], env["jnp"]
  rng = np.random.default_rng()
  bf16 = jnp.bfloat16
  carry = lambda ins, out: (out, *ins[1:])  # the output is the next call's first input
  if name in ("axpy", "rmsnorm"):
    m, n = 16384, 8192
    rowwise = jax.ShapeDtypeStruct((m, n), bf16)
    if name == "axpy":
      return {"fn": env["ew"].axpy, "constexprs": {"alpha": 0.5}, "avals": (rowwise, rowwise), "out": rowwise,
              "inputs": lambda: [rng.standard_normal((m, n), np.float32).astype(bf16) for _ in "xy"],
              "carry": carry, "chain": 20, "reference": lambda ins: env["ew"].axpy_reference(*ins, 0.5),
              "tolerance": 1e-2, "work": 3.0 * m * n * 2, "unit": "GB/s"}
    return {"fn": env["norm"].rmsnorm, "constexprs": {"threads": 256},
            "avals": (rowwise, jax.ShapeDtypeStruct((n,), bf16)), "out": rowwise,
            "inputs": lambda: [rng.standard_normal((m, n), np.float32).astype(bf16),
                               (1 + 0.1 * rng.standard_normal(n, np.float32)).astype(bf16)],
            "carry": carry, "chain": 20, "reference": lambda ins: env["norm"].rmsnorm_reference(*ins),
            "tolerance": 2e-2, "work": 2.0 * m * n * 2, "unit": "GB/s"}
  if name.startswith("gemm"):
    n = int(name.split("_")[1])
    cluster_m = 2 if name.endswith("cluster2") else 1
    square = jax.ShapeDtypeStruct((n, n), bf16)
    constexprs = {"cluster_m": cluster_m}
    if cluster_m > 1:
      constexprs["max_clusters"] = max_clusters(env, cluster_m)

    def inputs():  # B scaled by 1/sqrt(n): a chain's values stay O(1)
      return [rng.standard_normal((n, n), np.float32).astype(bf16),
              (rng.standard_normal((n, n), np.float32) / np.sqrt(n)).astype(bf16)]

    def reference(ins):  # cuBLAS in f32 on the GPU: numpy would take minutes at 8192
      return np.asarray(jnp.matmul(jnp.asarray(ins[0]), jnp.asarray(ins[1]).T, preferred_element_type=jnp.float32))
    return {"fn": env["gemm"].hopper_gemm, "constexprs": constexprs, "avals": (square, square), "out": square,
            "inputs": inputs, "carry": carry, "chain": 10 if n <= 4096 else 4, "reference": reference,
            "tolerance": 1e-2, "work": 2.0 * n ** 3, "unit": "TFLOP/s", "cublas": lambda x, y: jnp.matmul(x, y.T)}
  raise ValueError(f"no case {name!r}")


def _error(got, want) -> float:
  import numpy as np
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  return float(np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30))


def jax_paths(case: dict, env: dict) -> dict:
  """name -> function of jax arrays returning the output, for the paths inside jax.jit."""
  fn, out, constexprs = case["fn"], case["out"], case["constexprs"]
  options = {"output_shape_dtype": out, "use_static_tensors": True}
  paths = {"cutlass_call": env["cjax"].cutlass_call(fn, **options, **constexprs)}
  paths["ours"] = env["jmf"].cute_call(fn, **options, **constexprs)
  if "cublas" in case:
    paths["cublas"] = case["cublas"]
  return paths


def stamped_chain(call, carry, chain: int):
  """The timed program: GPU clock before, `chain` calls each fed by the last, GPU clock after (jit it)."""
  from jax_mosaic_ffi.transforms import gpu_clock

  def program(*xs):
    out = None
    for _ in range(chain):
      out = call(*xs)
      xs = carry(xs, out)
    return out
  return gpu_clock.timed(program)


class NativeChain:
  """The DSL's own launcher: `cute.compile`'s function on torch tensors, the chain ping-ponging between two
  output buffers, GPU time between CUDA events behind a sleep kernel."""

  def __init__(self, case: dict, inputs: list, env: dict):
    torch, cute, cuda, from_dlpack = env["torch"], env["cute"], env["cuda"], env["from_dlpack"]
    self.torch, self.case = torch, case
    self.stream = cuda.CUstream(torch.cuda.current_stream().cuda_stream)
    self.inputs = [self._tensor(a) for a in inputs]
    self.outputs = [torch.empty(case["out"].shape, device="cuda", dtype=self.inputs[0].dtype) for _ in "ab"]
    self.cute_in = [from_dlpack(t, assumed_align=16) for t in self.inputs]
    self.cute_out = [from_dlpack(t, assumed_align=16) for t in self.outputs]
    self.compiled = cute.compile(case["fn"], self.stream, *self.cute_in, self.cute_out[0], **case["constexprs"])

  def _tensor(self, array):
    import numpy as np
    torch = self.torch
    t = torch.from_numpy(np.asarray(array, np.float32)).cuda()
    return t.to(torch.bfloat16) if str(array.dtype) == "bfloat16" else t

  def once(self):
    """One call on the inputs; the output as numpy float32."""
    self.compiled(self.stream, *self.cute_in, self.cute_out[0])
    self.torch.cuda.synchronize()
    return self.outputs[0].float().cpu().numpy()

  def sample(self) -> float:
    """GPU seconds per call of the chain."""
    torch, chain = self.torch, self.case["chain"]
    start, stop = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    if hasattr(torch.cuda, "_sleep"):
      torch.cuda._sleep(SLEEP_CYCLES)
    start.record()
    ins = list(self.cute_in)
    for k in range(chain):
      out = self.cute_out[k % 2]
      self.compiled(self.stream, *ins, out)
      ins = list(self.case["carry"](ins, out))
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop) / 1e3 / chain


def _measure_case(name: str, env: dict, rounds: int) -> dict:
  import jax
  import numpy as np

  from jax_mosaic_ffi.transforms import gpu_clock
  case = make_case(name, env)
  inputs = case["inputs"]()
  arrays = [jax.device_put(a) for a in inputs]
  want = case["reference"](inputs)
  paths = jax_paths(case, env)
  native = NativeChain(case, inputs, env)
  errors = {"dsl": _error(native.once(), want)}
  for key, call in paths.items():
    errors[key] = _error(np.asarray(jax.jit(call)(*arrays)), want)
  for key, error in errors.items():
    if not error <= case["tolerance"]:
      raise AssertionError(f"{name}: {key} result is off by {error:.2e} of the largest element "
                           f"(tolerance {case['tolerance']:.0e})")
  chain = case["chain"]
  stamped = {key: jax.jit(stamped_chain(call, case["carry"], chain)) for key, call in paths.items()}

  def jax_sample(program):
    start, stop, _ = program(*arrays)
    return gpu_clock.elapsed_s(start, stop) / chain
  samplers = {"dsl": native.sample, **{key: (lambda p=p: jax_sample(p)) for key, p in stamped.items()}}
  seconds = timing.interleaved_samples(samplers, rounds)
  scale = 1e12 if case["unit"] == "TFLOP/s" else 1e9
  result = {"chain": chain, "rounds": rounds, "unit": case["unit"], "work": case["work"], "max_error": errors,
            "constexprs": case["constexprs"], "us": {key: s * 1e6 for key, s in seconds.items()},
            "throughput": {key: case["work"] / s / scale for key, s in seconds.items()}}
  # Above 1: faster than the DSL's own launch of the same kernel.
  result["over_dsl"] = {key: seconds["dsl"] / s for key, s in seconds.items() if key != "dsl"}
  if "cublas" in seconds:
    result["over_cublas"] = {key: seconds["cublas"] / s for key, s in seconds.items() if key != "cublas"}
  return result


# ------------------------------------------------------------------ launch cost (in the child)

ADD_ONE_CUDA = r'''
extern "C" __global__ void add_one(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] + 1.0f;
}
'''


def _measure_launch(env: dict, rounds: int) -> dict:
  """Wall time per call of a jitted chain of LAUNCH_CHAIN add_one calls: ours, cutlass_call, a CUDA C++ kernel."""
  np, jax, jnp, jmf = env["np"], env["jax"], env["jnp"], env["jmf"]
  aval = jax.ShapeDtypeStruct((LAUNCH_N,), jnp.float32)
  calls = {"cutlass_call": env["cjax"].cutlass_call(env["ew"].add_one, output_shape_dtype=aval),
           "mosaic_cuda": jmf.mosaic_kernel(jmf.cuda_kernel(ADD_ONE_CUDA, "add_one"), aval, grid=1, block=LAUNCH_N,
                                            scalars=(np.int32(LAUNCH_N),))}
  calls["ours"] = jmf.cute_call(env["ew"].add_one, output_shape_dtype=aval)
  x = jnp.zeros((LAUNCH_N,), jnp.float32)
  programs = {}
  for key, call in calls.items():
    def chain(v, call=call):
      for _ in range(LAUNCH_CHAIN):
        v = call(v)
      return v
    programs[key] = jax.jit(chain)
    got = np.asarray(programs[key](x))
    if not np.all(got == LAUNCH_CHAIN):
      raise AssertionError(f"launch chain through {key}: expected {LAUNCH_CHAIN} everywhere, got {got[:4]}...")
  seconds = timing.interleaved({key: (lambda p=p: p(x).block_until_ready()) for key, p in programs.items()}, rounds)
  result = {"chain": LAUNCH_CHAIN, "rounds": rounds, "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "us_per_call": {key: s / LAUNCH_CHAIN * 1e6 for key, s in seconds.items()}}
  return result


# ------------------------------------------------------------------ warm start (fresh processes)

# Each stage of a fresh process, in order: its imports and backend (the process's fixed costs), then the call's
# stages: jax's trace (ours: the plan, the cache lookup and the kernel; cutlass_call: its compile), jax's lowering,
# XLA's compile of the program (it runs the instantiate stage, where the CuTe DSL runtime loads the object:
# "instantiate" is that part of it), and the first execution up to the result on the device.
# Warm-start variants: the side's call, and whether JAX's own persistent compilation cache is on (cold: empty).
WARM_SIDES = {"ours": ("ours", False), "cutlass_call": ("cutlass_call", False), "ours_jax_cache": ("ours", True)}

WARM_CHILD = r"""
import time
started = time.time()  # wall clock, as the parent's launch stamp
import json, sys
path, which, n, jax_cache = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
stamps = [("start", time.perf_counter())]
stamp = lambda name: stamps.append((name, time.perf_counter()))
import jax, jax.numpy as jnp, numpy as np
if jax_cache:  # JAX's persistent compilation cache, every program kept
  jax.config.update("jax_compilation_cache_dir", jax_cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
stamp("import_jax")
jax.block_until_ready(jax.jit(lambda v: v + 1)(jnp.zeros(8)))  # JAX's own startup is not the kernel's
stamp("backend")
sys.path.insert(0, path)
import cute_gemm  # the user's kernel file: it imports the DSL
stamp("import_dsl")
import jax_mosaic_ffi as jmf
if which == "cutlass_call":
  import cutlass.jax as cjax
stamp("import_front_end")
a = jax.block_until_ready(jnp.ones((n, n), jnp.bfloat16))
b = jax.block_until_ready(jnp.full((n, n), 1 / n, jnp.bfloat16))
out = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)
call = (jmf.cute_call if which == "ours" else cjax.cutlass_call)(cute_gemm.hopper_gemm, output_shape_dtype=out,
                                                                   use_static_tensors=True)
before = jmf.kernel_cache_stats()
stamp("inputs")
traced = jax.jit(call).trace(a, b)
stamp("trace")
lowered = traced.lower()
stamp("lower")
compiled = lowered.compile()
stamp("compile")
c = jax.block_until_ready(compiled(a, b))
stamp("run")
first_result = time.time()
after = jmf.kernel_cache_stats()
corner = np.asarray(c[:8, :8].astype(jnp.float32))  # every element of ones @ (1/n)^T is 1
seconds = {name: t - stamps[k][1] for k, (name, t) in enumerate(stamps[1:])}
print("CHILD " + json.dumps({
    "first_result_s": sum(seconds[s] for s in ("trace", "lower", "compile", "run")), "stages_s": seconds,
    "instantiate_s": after.instantiate_seconds - before.instantiate_seconds, "started": started,
    "first_result_wall": first_result, "value": float(corner.min()), "value_max": float(corner.max()),
    "cute_compiles": after.compiles["cute"] - before.compiles["cute"]}))
"""


def _warm_child(which: str, cache_dir: str, jax_cache: bool) -> dict:
  env = {"JAX_MOSAIC_FFI_CACHE_DIR": os.path.join(cache_dir, "jmf"),
         "CUTE_DSL_CACHE_DIR": os.path.join(cache_dir, "cute_dsl")}
  launched = time.time()
  try:
    result = json_child(WARM_CHILD, [KERNELS, which, str(WARM_START_SIZE),
                                     os.path.join(cache_dir, "jax") if jax_cache else ""], env, 200, tail=1500)
  except RuntimeError as e:
    raise RuntimeError(f"{which}: {e}") from None
  if abs(result["value"] - 1.0) > 1e-2 or abs(result["value_max"] - 1.0) > 1e-2:
    raise AssertionError(f"{which}: the first result holds {result['value']}..{result['value_max']}, not 1")
  result["process_s"] = result["first_result_wall"] - launched  # the interpreter's own start included
  return result


def _median_stages(children: list[dict]) -> dict:
  stages = {name: statistics.median(c["stages_s"][name] for c in children) for name in children[0]["stages_s"]}
  stages["instantiate"] = statistics.median(c["instantiate_s"] for c in children)
  return stages


def _measure_warm_start(env: dict) -> dict:
  """Per side (WARM_SIDES), medians over pairs of fresh processes: cold_s and warm_s (from the call to its first
  result on the device), process_cold_s and process_warm_s (from the process's launch), each stage's seconds
  ("stages": {side: {"cold": ..., "warm": ...}}), and the CuTe compiles of the last pair."""
  keys = ("cold_s", "warm_s", "warm_over_cold", "process_cold_s", "process_warm_s", "process_warm_over_cold",
          "stages", "cute_compiles")
  result = {"size": WARM_START_SIZE, "pairs": WARM_START_PAIRS, **{k: {} for k in keys}, "errors": {}}
  for side in WARM_SIDES:
    which, jax_cache = WARM_SIDES[side]
    pairs = []
    try:
      for _ in range(WARM_START_PAIRS):
        with tempfile.TemporaryDirectory(prefix="cute-warm-") as cache_dir:
          pairs.append((_warm_child(which, cache_dir, jax_cache), _warm_child(which, cache_dir, jax_cache)))
    except Exception as e:  # one side's failure is its row
      result["errors"][side] = f"{type(e).__name__}: {str(e)[:1500]}"
      continue
    cold, warm = [p[0] for p in pairs], [p[1] for p in pairs]
    for prefix, key in (("", "first_result_s"), ("process_", "process_s")):
      result[f"{prefix}cold_s"][side] = statistics.median(c[key] for c in cold)
      result[f"{prefix}warm_s"][side] = statistics.median(c[key] for c in warm)
      result[f"{prefix}warm_over_cold"][side] = result[f"{prefix}warm_s"][side] / result[f"{prefix}cold_s"][side]
    result["stages"][side] = {"cold": _median_stages(cold), "warm": _median_stages(warm)}
    result["cute_compiles"][side] = [pairs[-1][0]["cute_compiles"], pairs[-1][1]["cute_compiles"]]
  return result


# ------------------------------------------------------------------ the run

def run(cases=(), rounds: int = ROUNDS, launch: bool = False, warm_start: bool = False) -> dict:
  # Two allocators share the GPU: JAX must not take 75% of it first.
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
  with_torch = bool(cases)  # the DSL's own launcher runs on torch tensors; launch and warm start need no torch
  try:
    env = environment(with_torch)
  except ImportError as e:
    return {"skipped": f"needs the CuTe DSL (nvidia-cutlass-dsl){' and torch' if with_torch else ''} beside jax "
                       f"({e})"}
  if env["jax"].default_backend() != "gpu" or (with_torch and not env["torch"].cuda.is_available()):
    return {"skipped": "needs a GPU visible to " + ("both jax and torch" if with_torch else "jax")}
  if with_torch:  # torch makes the device's primary context current: the DSL's occupancy query needs one
    env["torch"].zeros(1, device="cuda")
  versions = {"cutlass_dsl": getattr(env["cutlass"], "__version__", "?"), "jax": env["jax"].__version__,
              **({"torch": env["torch"].__version__} if with_torch else {})}
  result = {"versions": versions, "cases": {}, "speed": {}, "errors": {}}
  if launch:
    try:
      result.update(_measure_launch(env, max(rounds, 30)))
    except Exception as e:
      result["errors"]["ours"] = f"{type(e).__name__}: {str(e)[:2000]}"
    return result
  if warm_start:
    measured = _measure_warm_start(env)
    result["errors"].update(measured.pop("errors"))
    result.update(measured)
    return result
  for name in cases:
    try:
      result["cases"][name] = _measure_case(name, env, rounds)
      result["speed"][name] = result["cases"][name]["over_dsl"]["ours"]
    except Exception as e:  # one case's failure is its row, not the run's
      result["errors"][name] = f"{type(e).__name__}: {str(e)[:2000]}"
    gc.collect()
    env["torch"].cuda.empty_cache()
  stats = env["jmf"].kernel_cache_stats()
  result["cute_compiles"] = getattr(stats, "cute_compiles", None)
  return result


# ------------------------------------------------------------------ the report (no jax)

def _case_rows(results: dict) -> tuple[list, list]:
  rows, notes = [], []
  for run_name in ("rowwise", "gemm"):
    r = results.get(run_name)
    why = failure(r)
    if why:
      notes.append(f"- {run_name}: n/a: {why}")
      continue
    if "ours" in r.get("errors", {}):
      notes.append(f"- {run_name}, ours: {last_line(r['errors']['ours'])}")
    for name, error in r.get("errors", {}).items():
      if name in CASES and name not in r["cases"]:
        rows.append([CASES[name], "n/a", "n/a", "n/a", "n/a", last_line(error)[:120], "", ""])
    for name, c in r["cases"].items():
      us, rate = c["us"], c["throughput"]

      def cell(key):
        return f"{sig(us[key])} ({sig(rate[key])})" if key in us else "n/a"
      ours = c["over_dsl"].get("ours")
      rows.append([CASES.get(name, name), cell("dsl"), cell("cutlass_call"), cell("ours"),
                   f"**{fmt(ours)}x**" if ours is not None else "n/a", c["unit"],
                   cell("cublas") if "cublas" in us else "",
                   " / ".join(f"{c['max_error'][k]:.1e}" for k in PATHS if k in c["max_error"])])
  return rows, notes


def tables(results: dict) -> list[str]:
  rows, notes = _case_rows(results)
  method = (
      "Kernels written the way the DSL's examples write them (`benchmarks/kernels/cute_*.py`: `@cute.jit` launchers "
      "`(stream, *inputs, *outputs, **constexprs)`), run in one process through the DSL's own launcher "
      "(`cute.compile`'s function on torch tensors from `from_dlpack`), through `cutlass.jax.cutlass_call` and "
      "through ours (`jmf.cute_call`) inside `jax.jit`, all three the same static-shape specialization; the GEMM "
      "also against cuBLAS (`jnp.matmul(a, b.T)`). GPU time per call in microseconds (and rate): the DSL launcher's "
      "between CUDA events behind a sleep kernel, the jitted ones between two GPU clock stamps inside the program; "
      "a chain of calls each fed by the last, medians of interleaved rounds, every path checked against a reference "
      "first (max error relative to the largest element: DSL / cutlass_call / ours / cuBLAS). Ratio above 1: ours "
      "is faster than the DSL's own launch.")
  header = ["kernel", "DSL launcher us (rate)", "cutlass_call us (rate)", "ours us (rate)", "ours / DSL",
            "rate unit", "cuBLAS us (rate)", "max error"]
  blocks = [method + "\n\n" + table(header, rows, "lrrrrlrl") + ("\n\n" + "\n".join(notes) if notes else "")]
  blocks.append(_launch_block(results))
  blocks.append(_warm_block(results.get("warm_start")))
  blocks.append(_gemm_note(results))
  return blocks


def _launch_block(results: dict) -> str:
  rows = []
  for run_name, label in (("launch", "on"), ("launch_cb_off", "off")):
    r = results.get(run_name)
    why = failure(r)
    if why or "us_per_call" not in (r or {}):
      rows.append([label, why or last_line(str((r or {}).get("errors", "?"))), "", "", ""])
      continue
    us = r["us_per_call"]
    ratio = us["ours"] / us["cutlass_call"] if "ours" in us else None
    rows.append([label, sig(us.get("ours")) if "ours" in us else "n/a", sig(us["cutlass_call"]),
                 f"**{fmt(ratio)}x**" if ratio is not None else "n/a", sig(us.get("mosaic_cuda"))])
  return (f"Host cost per call inside `jit`: a chain of {LAUNCH_CHAIN} calls of a trivial kernel (`add_one`, "
          f"{LAUNCH_N} floats), wall time per call, medians of interleaved rounds. The CUDA C++ column is the same "
          "kernel through `mosaic_kernel`, for reference.\n\n" +
          table(["command buffers", "ours us", "cutlass_call us", "ours / cutlass_call", "CUDA C++ (mosaic_kernel) us"],
                rows, "lrrrr"))


WARM_LABELS = {"ours": "ours (jmf.cute_call)", "cutlass_call": "cutlass_call",
               "ours_jax_cache": "ours, JAX's compilation cache on too"}
STAGE_LABELS = {"import_jax": "import jax", "backend": "JAX backend up (a first jit)",
                "import_dsl": "import the kernel's file (the DSL)", "import_front_end": "import the front end",
                "inputs": "inputs on the GPU", "trace": "trace (ours: plan, cache lookup, kernel)",
                "lower": "lower to StableHLO", "compile": "XLA compile",
                "instantiate": "of which instantiate (object load)",
                "run": "first execution, to the result"}


def _ms(seconds) -> str:
  return "n/a" if seconds is None else f"{1e3 * seconds:.1f}"


def _warm_block(r) -> str:
  why = failure(r)
  if why:
    return f"Warm start: n/a: {why}"
  rows = []
  for side, label in WARM_LABELS.items():
    if side not in r["cold_s"]:
      error = r.get("errors", {}).get(side)
      if error is not None:
        rows.append([label, "n/a", "n/a", last_line(error)[:120], "", "", "", ""])
      continue
    compiles = r["cute_compiles"].get(side) if side != "cutlass_call" else None
    process = (side in r.get("process_cold_s", {}))
    rows.append([label, f"{fmt(r['cold_s'][side], 2)} s", f"{fmt(r['warm_s'][side], 3)} s",
                 f"**{fmt(100 * r['warm_over_cold'][side], 1)}%**",
                 f"{fmt(r['process_cold_s'][side], 2)} s" if process else "n/a",
                 f"{fmt(r['process_warm_s'][side], 2)} s" if process else "n/a",
                 f"{fmt(100 * r['process_warm_over_cold'][side], 1)}%" if process else "n/a",
                 " / ".join("n/a" if n is None else str(n) for n in compiles) if compiles else "n/a"])
  text = (f"Warm start: the first result of the GEMM ({r['size']}^3 bf16) in a fresh process, cold (empty caches: "
          "ours and the DSL's file cache) and warm (the same cache folders again); medians of "
          f"{r['pairs']} pairs. *First result*: from the call (the process's JAX backend up, the kernel's file "
          "imported) to the GEMM's output ready on the GPU; *whole process*: from the process's launch to the same "
          "point, as a user restarting a server sees it.\n\n" +
          table(["path", "cold", "warm", "warm / cold", "whole process cold", "whole process warm",
                 "whole process warm / cold", "CuTe compiles (cold / warm)"], rows, "lrrrrrrl"))
  stages = r.get("stages") or {}
  if stages:
    columns = [(side, phase) for side in WARM_LABELS if side in stages for phase in ("cold", "warm")]
    names = [n for n in STAGE_LABELS if any(n in stages[side][phase] for side, phase in columns)]
    breakdown = [[STAGE_LABELS[n], *(_ms(stages[side][phase].get(n)) for side, phase in columns)] for n in names]
    text += ("\n\nWhere the time goes, stage by stage (milliseconds, medians); the first result is the sum of the "
             "stages from trace to first execution:\n\n" +
             table(["stage", *(f"{WARM_LABELS[side]}, {phase}" for side, phase in columns)], breakdown))
    if "ours" in stages:
      text += "\n\n" + _warm_shares(stages["ours"]["warm"], r["cold_s"]["ours"])
  return text


def _warm_shares(warm: dict, cold_s: float) -> str:
  """Whose the warm first result is: jax's tracing and lowering with our lookup, XLA's compile, the DSL runtime's
  object load, the GEMM itself."""
  ours = warm["trace"] + warm["lower"]
  xla = warm["compile"] - warm["instantiate"]
  total = ours + warm["compile"] + warm["run"]
  return (f"Of the warm first result ({_ms(total)} ms): trace and lowering, where our cache lookup runs, "
          f"{_ms(ours)} ms; XLA's compile of the program {_ms(xla)} ms; the instantiate stage, where the CuTe DSL "
          f"runtime loads the object ({WARM_INSTANTIATE_NOTE}), {_ms(warm['instantiate'])} ms; the first execution "
          f"{_ms(warm['run'])} ms. 5% of the cold first result is {_ms(0.05 * cold_s)} ms.")


WARM_INSTANTIATE_NOTE = "CuteDSLRT_Module_Create_From_Bytes links the host code, Get_Function loads the cubin"


GEMM_NOTE = (
    "**The GEMM** (`benchmarks/kernels/cute_gemm.py`) is ours, written in the DSL's Hopper style: a producer "
    "warpgroup streams 128x64 and 256x64 tiles with TMA into a 4-stage ring (`PipelineTmaAsync`), two consumer "
    "warpgroups issue `wgmma` 64x256x16 with f32 accumulators, persistent CTAs walk the tiles in grouped order, and "
    "the epilogue stores 128x32 bf16 slices through shared memory with TMA; its tile width, cluster (1, or 2 with B "
    "multicast), raster group and resident clusters are constexprs.\n\n"
    "Beside NVIDIA's persistent Hopper example (`dense_gemm_persistent.py` of the DSL's examples, read, not copied) "
    "it has the same structure: 128x256x64 tiles, a TMA producer warpgroup at 40 registers and two cooperative "
    "consumer warpgroups at 232, the same shared-memory budget (1 KiB of barriers, four 128x32 epilogue slices "
    "apart from the ring, so 4 stages of A+B), one wgmma group in flight, a persistent grid of the resident "
    "clusters, the same epilogue (stmatrix into 4 slice buffers, a TMA store per slice, two named barriers per "
    "slice), B multicast in 2-CTA clusters. It differs in the tile order (ours walks 8 cluster rows at a time, the "
    "example's run() all of M, swizzle 1), in fencing the accumulators before every stage's wgmma (as CUTLASS's "
    "C++ mainloop does; the example fences once per tile), and in its loops (ours disable unrolling, the example "
    "leaves it to the compiler). Run by hand (fp16, 2026-12-04), the examples' own run() measured 10-25% above "
    "this kernel, but on other data: their run() fills A and B with integers in [-2, 2), these benchmarks with "
    "normal values, and an H200 GEMM is power-bound, so data with fewer changing bits runs at a higher clock "
    "(this kernel itself ran 5-12% faster in bf16, 7 mantissa bits, than in fp16, 10, on the same normal "
    "values); the hand-run driver times the examples' kernels, ours and cuBLAS on the same data (through the "
    "DSL's launcher and through ours), which settles it.\n\n"
    "What the GEMM needs to reach cuBLAS: the 2-CTA cluster with B multicast, which halves each CTA's B traffic "
    "through L2 (a constexpr here; see the clustered rows); beyond that, what neither this kernel nor NVIDIA's "
    "example has: a tile's epilogue overlapped with the next tile's MMAs (ping-pong consumers, each warpgroup with "
    "a tile of its own, or an epilogue warpgroup), worth the epilogue's share of a tile (a tile's mainloop is 128 "
    "k-steps at 8192, 64 at 4096), and no partial last wave (2048 tiles on 132 SMs are 15.5 waves at 8192, 512 "
    "are 3.9 at 4096: up to 3% idle; stream-K or a split-K tail removes it).")


def _gemm_note(results: dict) -> str:
  r = results.get("gemm") or {}
  ratios = [f"{CASES.get(name, name)}: {fmt(c['over_cublas']['ours'])}x" for name, c in (r.get("cases") or {}).items()
            if "ours" in (c.get("over_cublas") or {})]
  return GEMM_NOTE + ("\n\nOurs over cuBLAS in this run (GPU time, same data; above 1: faster): " + "; ".join(ratios) +
                      "." if ratios else "")
