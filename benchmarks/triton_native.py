"""Triton kernels as users write them: through our runtime and through Triton's own launcher, in one process.

The kernels (kernels/triton_user.py) take their strides as arguments and carry `@triton.autotune` /
`@triton.heuristics`. Each runs twice on the same inputs: through `jmf.mosaic_kernel(jmf.triton_kernel(...))`
inside `jax.jit`, and through Triton's launcher (`kernel[grid](...)` on torch tensors). Both results are checked
against a float32 torch reference first. Then the GPU time per call of each, interleaved round by round, median:
ours between two GPU clock stamps inside the jitted program (a chain of calls, each feeding the next), Triton's
between two CUDA events on torch's stream behind a sleep kernel, so that neither side's host launch speed counts.
Both autotune their configs; the winners are reported, and where they differ Triton's launcher is timed at our
winner too. The launch run measures the host cost per call: a jitted chain of small Triton launches through
jmf against Triton's eager `kernel[grid](...)` loop.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
from typing import Callable

from benchmarks.markdown import failure, fmt, last_line, launch_failure, sig, table
from benchmarks.suite import Run

NAME = "triton_native"
TITLE = "Triton kernels as users write them: our runtime against Triton's own launcher"
ORDER = 57
RUNS = (Run("matmul", kwargs={"cases": ("matmul_4096", "matmul_8192")}, timeout_s=240),
        Run("attention", kwargs={"cases": ("attention", "attention_causal")}, timeout_s=240),
        Run("rowwise", kwargs={"cases": ("softmax", "layer_norm")}, timeout_s=150),
        Run("launch", kwargs={"cases": ()}, timeout_s=120))

ROUNDS = 15
LAUNCH_CHAIN = 200
SLEEP_CYCLES = 20_000_000  # ~10 ms at the H200's clock: longer than the host takes to enqueue a chain

# The cases: name -> what the table says of it. The GPU work of each is in _case().
CASES = {
    "matmul_4096": "grouped matmul, 4096^3 fp16",
    "matmul_8192": "grouped matmul, 8192^3 fp16",
    "attention": "flash attention fwd, 4x32x4096x128 fp16",
    "attention_causal": "flash attention fwd, causal, 4x32x4096x128 fp16",
    "softmax": "fused softmax, 32768x4096 fp32",
    "layer_norm": "layer norm fwd + bwd, 16384x8192 fp16",
}

# ------------------------------------------------------------------ the decorators, unwrapped or not

def unwrap(fn):
  """(the @triton.jit function, the @triton.autotune configs as dicts or None, the @triton.heuristics values)."""
  from triton.runtime.autotuner import Autotuner, Heuristics
  configs, heuristics = None, {}
  while isinstance(fn, (Autotuner, Heuristics)):
    if isinstance(fn, Autotuner):
      configs = [{**c.kwargs, "num_warps": c.num_warps, "num_stages": c.num_stages, "num_ctas": c.num_ctas}
                 for c in fn.configs]
    else:
      heuristics.update(fn.values)
    fn = fn.fn
  return fn, configs, heuristics


def through_jmf(jmf, decorated, out_shape, *, grid, scalars, param_order, avals, constexprs=None, num_warps=None):
  """The call of a decorated Triton kernel through mosaic_kernel, as a user writes it (``avals`` unused: the
  decorators' heuristics see the call's own arguments)."""
  del avals
  options = {} if num_warps is None else {"num_warps": num_warps}
  kernel = jmf.triton_kernel(decorated, constexprs=dict(constexprs or {}) or None, **options)
  return jmf.mosaic_kernel(kernel, out_shape, grid=grid, scalars=scalars, param_order=param_order)


class Pinned:
  """A decorated kernel launched by Triton's launcher at one given config (`pinned[grid](...)`), its
  heuristics still applied: Triton's side at our autotuner's winner."""

  def __init__(self, decorated, config: dict):
    self.fn, _, self.heuristics = unwrap(decorated)
    self.config = dict(config)

  def __getitem__(self, grid):
    def launch(*args, **kwargs):
      named = {**dict(zip(self.fn.arg_names, args)), **kwargs, **self.config}
      extra = {key: heuristic(named) for key, heuristic in self.heuristics.items()}
      dims = grid({**named, **extra}) if callable(grid) else grid
      return self.fn[dims](*args, **kwargs, **self.config, **extra)
    return launch


# ------------------------------------------------------------------ the cases

@dataclasses.dataclass(frozen=True)
class Case:
  """One kernel, both ways. `ours(*jax arrays)` and `theirs(launched, *torch tensors)` return the outputs;
  `launched` is what `theirs` launches (a decorated kernel, or the kernels module); `reference(*float32
  tensors)` returns what the outputs are checked against (leading slices of them); `carry(inputs, outputs)`
  gives the next call's inputs in a chain of `chain` calls; `work` is FLOPs or bytes per call."""

  inputs: Callable[[], list]  # numpy arrays, made only when measured
  avals: tuple
  ours: Callable
  theirs: Callable
  launched: object
  reference: Callable
  carry: Callable
  chain: int
  tolerance: float
  work: float
  unit: str
  grads: Callable | None = None  # jax.grad of a loss through the kernels, checked like the outputs


def make_case(name, env) -> Case:
  np, jax, jnp, jmf, torch, triton, K = (env[k] for k in ("np", "jax", "jnp", "jmf", "torch", "triton", "K"))
  rng = np.random.default_rng()
  i32 = np.int32
  if name.startswith("matmul"):
    n = int(name.split("_")[1])
    aval = jax.ShapeDtypeStruct((n, n), jnp.float16)
    ours = through_jmf(jmf, K.matmul_kernel, aval, avals=(aval, aval), param_order=(
        "in0", "in1", "out0", *(f"scalar{k}" for k in range(9))),
        grid=lambda meta: (jmf.cdiv(n, meta["BLOCK_M"]) * jmf.cdiv(n, meta["BLOCK_N"]),),
        scalars=(i32(n), i32(n), i32(n), i32(n), i32(1), i32(n), i32(1), i32(n), i32(1)))

    def theirs(kernel, x, y):
      (m, k), (_, n_) = x.shape, y.shape
      c = torch.empty((m, n_), device=x.device, dtype=torch.float16)
      kernel[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n_, meta["BLOCK_N"]),)](
          x, y, c, m, n_, k, x.stride(0), x.stride(1), y.stride(0), y.stride(1), c.stride(0), c.stride(1))
      return (c,)
    def inputs():  # B scaled by 1/sqrt(n): a chain's values stay O(1)
      return [rng.standard_normal((n, n), np.float32).astype(np.float16),
              (rng.standard_normal((n, n), np.float32) / np.sqrt(n)).astype(np.float16)]
    return Case(inputs, (aval, aval), lambda x, y: (ours(x, y),), theirs, K.matmul_kernel, lambda x, y: (x @ y,),
                lambda ins, outs: (outs[0], ins[1]), 20 if n <= 4096 else 5, 1e-2, 2.0 * n ** 3, "TFLOP/s")
  if name.startswith("attention"):
    causal = name.endswith("causal")
    z, h, s, d = 4, 32, 4096, 128
    scale = float(1.0 / np.sqrt(d))  # a Python float: fp32 to Triton's launcher, as np.float32 is to ours
    aval = jax.ShapeDtypeStruct((z, h, s, d), jnp.float16)
    strides = [s * h * d, s * d, d, 1]
    ours = through_jmf(
        jmf, K.attention_fwd, (aval, jax.ShapeDtypeStruct((z * h, s), jnp.float32)), avals=(aval,) * 3,
        param_order=("in0", "in1", "in2", "scalar0", "out1", "out0", *(f"scalar{k}" for k in range(1, 19))),
        grid=lambda meta: (jmf.cdiv(s, meta["BLOCK_M"]), z * h, 1),
        scalars=(np.float32(scale), *(i32(x) for x in strides * 4), i32(h), i32(s)),
        constexprs={"HEAD_DIM": d, "CAUSAL": causal})

    def theirs(kernel, q_, k_, v_):
      out = torch.empty_like(q_)
      lse = torch.empty((z * h, s), device=q_.device, dtype=torch.float32)
      kernel[lambda meta: (triton.cdiv(s, meta["BLOCK_M"]), z * h, 1)](
          q_, k_, v_, scale, lse, out, *q_.stride(), *k_.stride(), *v_.stride(), *out.stride(), h, s,
          HEAD_DIM=d, CAUSAL=causal)
      return out, lse

    def reference(q_, k_, v_):  # batch 0, four heads: the whole would need GiBs of scores
      return (torch.nn.functional.scaled_dot_product_attention(q_[:1, :4], k_[:1, :4], v_[:1, :4],
                                                               is_causal=causal, scale=scale),)
    flops = 4.0 * z * h * s * s * d * (0.5 if causal else 1.0)
    return Case(lambda: [rng.standard_normal((z, h, s, d), np.float32).astype(np.float16) for _ in range(3)],
                (aval,) * 3, lambda *x: ours(*x), theirs, K.attention_fwd, reference,
                lambda ins, outs: (outs[0], *ins[1:]), 3, 1e-2, flops, "TFLOP/s")
  if name == "softmax":
    rows, cols = 32768, 4096
    aval = jax.ShapeDtypeStruct((rows, cols), jnp.float32)
    ours = through_jmf(jmf, K.softmax_kernel, aval, avals=(aval,), num_warps=8, grid=(rows,),
                       param_order=("out0", "in0", "scalar0", "scalar1", "scalar2", "scalar3"),
                       scalars=(i32(cols), i32(cols), i32(rows), i32(cols)))

    def theirs(kernel, x_):
      y = torch.empty_like(x_)
      kernel[(x_.shape[0],)](y, x_, x_.stride(0), y.stride(0), x_.shape[0], x_.shape[1], num_warps=8)
      return (y,)
    return Case(lambda: [rng.standard_normal((rows, cols), np.float32)], (aval,), lambda x_: (ours(x_),), theirs,
                K.softmax_kernel, lambda x_: (torch.softmax(x_, dim=1),), lambda ins, outs: (outs[0],), 20, 1e-5,
                2.0 * rows * cols * 4, "GB/s")
  if name == "layer_norm":
    return _layer_norm_case(env, rng)
  raise ValueError(f"no case {name!r}")


LN_PROGRAMS = 512  # programs of the backward's first kernel: each sums DW and DB over its share of the rows
LN_EPS = 1e-5


def _layer_norm_case(env, rng) -> Case:
  """Forward and backward, with jmf.differentiable and jax.vjp on our side; one fwd+bwd per timed call."""
  np, jax, jnp, jmf, torch, K = (env[k] for k in ("np", "jax", "jnp", "jmf", "torch", "K"))
  m, n = 16384, 8192
  i32 = np.int32
  row, vec, stats = (jax.ShapeDtypeStruct(s, d) for s, d in (((m, n), jnp.float16), ((n,), jnp.float16),
                                                               ((m,), jnp.float32)))
  partial = jax.ShapeDtypeStruct((LN_PROGRAMS, n), jnp.float32)
  block_n = 64
  fwd = through_jmf(jmf, K.layer_norm_fwd, (row, stats, stats), avals=(row, vec, vec), num_warps=8, grid=(m,),
                    param_order=("in0", "out0", "in1", "in2", "out1", "out2", "scalar0", "scalar1", "scalar2"),
                    scalars=(i32(n), i32(n), np.float32(LN_EPS)))
  dx_kernel = through_jmf(jmf, K.layer_norm_bwd_dx, (row, partial, partial), avals=(row, row, vec, stats, stats),
                          num_warps=8, grid=(LN_PROGRAMS,),
                          param_order=("out0", "in0", "in1", "in2", "in3", "in4", "out1", "out2", "scalar0",
                                       "scalar1", "scalar2"), scalars=(i32(n), i32(m), i32(n)))
  dwdb_kernel = through_jmf(jmf, K.layer_norm_bwd_dwdb, (vec, vec), avals=(partial, partial),
                            grid=(jmf.cdiv(n, block_n),), constexprs={"BLOCK_G": 32, "BLOCK_N": block_n},
                            param_order=("in0", "in1", "out0", "out1", "scalar0", "scalar1"),
                            scalars=(i32(LN_PROGRAMS), i32(n)))

  def bwd(x_, w_, mean, rstd, dy_, *_stat_cotangents):  # mean and rstd are not differentiated through
    dx, partial_dw, partial_db = dx_kernel(dy_, x_, w_, mean, rstd)
    return (dx, *dwdb_kernel(partial_dw, partial_db))
  norm = jmf.differentiable(fwd, bwd=bwd, residuals=("in0", "in1", "out1", "out2"))

  def layer_norm(x_, w_, b_):
    return norm(x_, w_, b_)[0]

  def ours(x_, w_, b_, dy_):  # timed: the kernels alone (jax.grad would add XLA's multiply by dy)
    y, pullback = jax.vjp(layer_norm, x_, w_, b_)
    return (y, *pullback(dy_))

  def grads(x_, w_, b_, dy_):
    loss = lambda *p: jnp.vdot(layer_norm(*p).astype(jnp.float32), dy_.astype(jnp.float32))
    return jax.grad(loss, argnums=(0, 1, 2))(x_, w_, b_)

  def theirs(K, x_, w_, b_, dy_):
    y, mean, rstd = torch.empty_like(x_), *(torch.empty(m, device=x_.device, dtype=torch.float32) for _ in "12")
    K.layer_norm_fwd[(m,)](x_, y, w_, b_, mean, rstd, x_.stride(0), n, LN_EPS, num_warps=8)
    dx = torch.empty_like(x_)
    partial_dw, partial_db = (torch.empty((LN_PROGRAMS, n), device=x_.device, dtype=torch.float32) for _ in "12")
    K.layer_norm_bwd_dx[(LN_PROGRAMS,)](dx, dy_, x_, w_, mean, rstd, partial_dw, partial_db, x_.stride(0), m, n,
                                         num_warps=8)
    dw, db = torch.empty_like(w_), torch.empty_like(b_)
    K.layer_norm_bwd_dwdb[(triton_cdiv(n, block_n),)](partial_dw, partial_db, dw, db, LN_PROGRAMS, n, BLOCK_G=32,
                                                       BLOCK_N=block_n)
    return y, dx, dw, db

  def reference(x_, w_, b_, dy_):
    x_, w_, b_ = (t.detach().requires_grad_() for t in (x_, w_, b_))
    y = torch.nn.functional.layer_norm(x_, (n,), w_, b_, LN_EPS)
    y.backward(dy_)
    return y, x_.grad, w_.grad, b_.grad
  def inputs():
    return [rng.standard_normal((m, n), np.float32).astype(np.float16),
            (1 + 0.1 * rng.standard_normal(n, np.float32)).astype(np.float16),
            (0.1 * rng.standard_normal(n, np.float32)).astype(np.float16),
            rng.standard_normal((m, n), np.float32).astype(np.float16)]
  # Bytes: the forward reads x and writes y, the backward reads x and dy and writes dx (fp16).
  return Case(inputs, (row, vec, vec, row), ours, theirs, K, reference, lambda ins, outs: ins, 1, 2e-2,
              5.0 * m * n * 2, "GB/s", grads)


def triton_cdiv(a, b):
  return -(-a // b)


# ------------------------------------------------------------------ measuring (in the child)

def environment(with_torch: bool = True) -> dict:
  """The modules a case needs (torch only to measure); raises ImportError naming what is missing."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import triton

  import jax_mosaic_ffi as jmf
  torch = None
  if with_torch:
    import torch
  from benchmarks.kernels import triton_user as K
  return {"np": np, "jax": jax, "jnp": jnp, "jmf": jmf, "torch": torch, "triton": triton, "K": K}


def stamped_chain(case: Case):
  """Our side's timed program: (GPU clock before, GPU clock after, outputs) of `case.chain` calls, each fed by
  the last (gpu_clock.timed: the stamps wait for the chain's inputs and for its last outputs)."""
  from jax_mosaic_ffi.transforms import gpu_clock

  def chain(*xs):
    outs = None
    for _ in range(case.chain):
      outs = case.ours(*xs)
      xs = case.carry(xs, outs)
    return outs
  return gpu_clock.timed(chain)


def _error(got, want) -> float:
  got, want = (np_.astype("float64") for np_ in (got, want))
  return float(abs(got - want).max() / max(abs(want).max(), 1e-30))


def _measure_case(name, env, rounds):
  from jax_mosaic_ffi.transforms import gpu_clock
  np, jax, jmf, torch = env["np"], env["jax"], env["jmf"], env["torch"]
  case = make_case(name, env)
  ours, theirs, launched, carry, chain, tolerance, unit = (
      case.ours, case.theirs, case.launched, case.carry, case.chain, case.tolerance, case.unit)
  inputs = case.inputs()
  tensors = [torch.from_numpy(a).to(torch.device("cuda")) for a in inputs]
  arrays = [jax.device_put(a) for a in inputs]
  autotuned = launched if type(launched).__name__ == "Autotuner" else None

  def launcher(kernel):
    return lambda *ts: theirs(kernel, *ts)
  triton_call = launcher(launched)

  # Correctness first (this also autotunes both sides and compiles everything).
  reports_before = len(jmf.autotune_report())
  ours_out = [np.asarray(o) for o in jax.jit(ours)(*arrays)]
  our_reports = jmf.autotune_report()[reports_before:]
  triton_out = [t.detach().float().cpu().numpy() for t in triton_call(*tensors)]
  torch.cuda.synchronize()
  want = [t.detach().float().cpu().numpy() for t in case.reference(*(t.float() for t in tensors))]
  errors = {}
  checked = [("ours", ours_out), ("triton", triton_out)]
  if case.grads is not None:  # the same kernels under jax.grad: dx, dw, db
    checked.append(("ours_grad", [None] + [np.asarray(g) for g in jax.jit(case.grads)(*arrays)]))
  for side, got in checked:
    errors[side] = max(_error(g[tuple(slice(0, s) for s in w.shape)], w) for g, w in zip(got, want)
                       if g is not None)
    if not errors[side] <= tolerance:
      raise AssertionError(f"{name}: {side} result is off by {errors[side]:.2e} of the largest element "
                           f"(tolerance {tolerance:.0e})")
  result = {"chain": chain, "rounds": rounds, "max_error": errors, "unit": unit, "work": case.work}
  samples = {"ours": [], "triton": []}
  calls = {"triton": triton_call}
  if autotuned is not None:
    configs = unwrap(autotuned)[1]
    triton_winner = {k: v for k, v in autotuned.best_config.all_kwargs().items() if k in configs[0]}
    # Our report's config, on the keys of a triton.Config (a decorated kernel's meta may hold more).
    ours_winner = {k: our_reports[-1]["config"].get(k) for k in triton_winner} if our_reports else None
    result["winners"] = {"triton": triton_winner, "ours": ours_winner}
    if ours_winner is not None and ours_winner != triton_winner:
      calls["triton_at_our_config"] = launcher(Pinned(autotuned, ours_winner))
      samples["triton_at_our_config"] = []

  jitted = jax.jit(stamped_chain(case))

  def ours_sample():
    start, stop, _ = jitted(*arrays)
    return gpu_clock.elapsed_s(start, stop) / chain

  def triton_sample(call):
    begin_event, end_event = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    if hasattr(torch.cuda, "_sleep"):
      torch.cuda._sleep(SLEEP_CYCLES)
    begin_event.record()
    xs = tensors
    for _ in range(chain):
      xs = carry(xs, call(*xs))
    end_event.record()
    end_event.synchronize()
    return begin_event.elapsed_time(end_event) / 1e3 / chain

  for _ in range(3):  # warm-up: the jitted chain compiles, both sides reach their clocks
    ours_sample()
    for call in calls.values():
      triton_sample(call)
  for _ in range(rounds):
    samples["ours"].append(ours_sample())
    for key, call in calls.items():
      samples[key].append(triton_sample(call))
  seconds = {key: statistics.median(s) for key, s in samples.items()}
  scale = 1e12 if unit == "TFLOP/s" else 1e9
  result["us"] = {key: s * 1e6 for key, s in seconds.items()}
  result["throughput"] = {key: case.work / s / scale for key, s in seconds.items()}
  result["speed"] = seconds["triton"] / seconds["ours"]  # ours relative to Triton's launcher: above 1 is faster
  return result


def _measure_launch(env) -> dict:
  """Host cost per call: a jitted chain of LAUNCH_CHAIN tiny Triton launches through jmf, against Triton's
  eager loop of the same launches on torch tensors."""
  from benchmarks import timing
  np, jax, jnp, jmf, torch, K = (env[k] for k in ("np", "jax", "jnp", "jmf", "torch", "K"))
  n = 1024
  aval = jax.ShapeDtypeStruct((n,), jnp.float32)
  call = through_jmf(jmf, K.add_one, aval, avals=(aval,), grid=(1,), scalars=(np.int32(n),),
                     param_order=("in0", "out0", "scalar0"), constexprs={"BLOCK": n})

  def chain(x):
    for _ in range(LAUNCH_CHAIN):
      x = call(x)
    return x
  jitted = jax.jit(chain)
  x = jnp.zeros((n,), jnp.float32)
  got = np.asarray(jitted(x))
  if not np.all(got == LAUNCH_CHAIN):
    raise AssertionError(f"launch chain: expected {LAUNCH_CHAIN} everywhere, got {got[:4]}...")
  xt = torch.zeros(n, device="cuda")
  yt = torch.empty_like(xt)

  def eager(sync=True):
    a, b = xt, yt
    for _ in range(LAUNCH_CHAIN):
      K.add_one[(1,)](a, b, n, BLOCK=n)
      a, b = b, a
    if sync:
      torch.cuda.synchronize()
  eager()
  if not torch.all(xt == LAUNCH_CHAIN):  # an even chain ends in xt
    raise AssertionError("Triton's eager chain did not add up")
  ours, triton_eager, triton_enqueue = timing.host_cost_per_call(lambda: jitted(x).block_until_ready(), eager,
                                                                 LAUNCH_CHAIN, torch.cuda.synchronize)
  return {"chain": LAUNCH_CHAIN,
          "us_per_call": {"ours": ours, "triton_eager": triton_eager, "triton_enqueue": triton_enqueue}}


def run(cases=(), rounds: int = ROUNDS) -> dict:
  # Two allocators share the GPU: JAX must not take 75% of it first.
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
  try:
    env = environment()
  except ImportError as e:
    return {"skipped": f"needs torch and triton beside jax ({e})"}
  if env["jax"].default_backend() != "gpu" or not env["torch"].cuda.is_available():
    return {"skipped": "needs a GPU visible to both jax and torch"}
  return measure(env, cases, rounds, _measure_case, _measure_launch)


def measure(env: dict, cases, rounds: int, measure_case: Callable, measure_launch: Callable) -> dict:
  """A run's result against Triton's own launcher (this benchmark's and gluon_native's): each case's GPU time
  (``measure_case(name, env, rounds)``), or, with no cases, the host cost per call (``measure_launch(env)``)."""
  versions = {"triton": env["triton"].__version__, "torch": env["torch"].__version__,
              "jax": env["jax"].__version__}
  # "measured" (suite.py): False when every part failed, so that the run fails while each part's error is its row.
  result = {"versions": versions, "cases": {}, "speed": {}, "errors": {}, "measured": False}
  if not cases:
    try:
      result.update(measure_launch(env), measured=True)
    except Exception as e:
      result["errors"]["ours"] = f"{type(e).__name__}: {e}"  # keyed as the goal's metric ends
    return result
  for name in cases:
    try:
      result["cases"][name] = measure_case(name, env, rounds)
      result["speed"][name] = result["cases"][name]["speed"]
      result["measured"] = True
    except Exception as e:  # one case's failure is its row, not the run's
      result["errors"][name] = f"{type(e).__name__}: {str(e)[:2000]}"
    gc.collect()  # the case's arrays and tensors, before the next case allocates its own
    env["torch"].cuda.empty_cache()
  result["triton_compiles"] = env["jmf"].kernel_cache_stats().compiles["triton"]
  return result


# ------------------------------------------------------------------ the report (no jax)

def _config_text(config) -> str:
  if not config:
    return "n/a"
  short = {"num_warps": "w", "num_stages": "s", "num_ctas": "c", "BLOCK_M": "M", "BLOCK_N": "N", "BLOCK_K": "K",
           "GROUP_M": "G"}
  return " ".join(f"{short.get(k, k)}{v}" for k, v in config.items() if not (k == "num_ctas" and v == 1))


def tables(results: dict) -> list[str]:
  rows, notes = [], []
  for run_name in ("matmul", "attention", "rowwise"):
    r = results.get(run_name)
    why = failure(r)
    if why:
      notes.append(f"- {run_name}: n/a: {why}")
      continue
    for name, error in r.get("errors", {}).items():
      rows.append([CASES.get(name, name), "n/a", "n/a", "n/a", last_line(error)[:120], "", ""])
    for name, c in r["cases"].items():
      winners = c.get("winners")
      winner_text = "" if not winners else (
          f"{_config_text(winners['triton'])} / {_config_text(winners['ours'])}")
      at_ours = c["us"].get("triton_at_our_config")
      if at_ours:
        winner_text += f" (Triton at ours: {sig(c['us']['triton_at_our_config'])} us)"
      rows.append([CASES.get(name, name), f"{sig(c['us']['triton'])} ({sig(c['throughput']['triton'])})",
                   f"{sig(c['us']['ours'])} ({sig(c['throughput']['ours'])})", f"**{fmt(c['speed'])}x**",
                   c["unit"], winner_text or "no autotune",
                   f"{c['max_error']['triton']:.1e} / {c['max_error']['ours']:.1e}"])
  method = (
      "Kernels written in the ordinary Triton style (`benchmarks/kernels/triton_user.py`: stride arguments, "
      "`@triton.autotune` with `key=`, `@triton.heuristics`), run in one process through `mosaic_kernel` inside "
      "`jax.jit` and through Triton's own launcher on torch tensors, same inputs, both checked against float32 "
      "torch first. Our side receives the decorated functions themselves. "
      "GPU time per call in microseconds (and throughput): ours between "
      "two GPU clock stamps inside the jitted program, Triton's between two CUDA events behind a sleep kernel, "
      "so host launch speed counts on neither side; a chain of calls each feeding the next (layer norm: one "
      "forward and backward, through `jmf.differentiable` and `jax.vjp`), medians of interleaved rounds. "
      "Both sides autotune; winners are Triton's / ours. Ratio above 1: ours is faster.")
  header = ["kernel", "Triton launcher us (rate)", "ours us (rate)", "ours / Triton", "rate unit",
            "autotune winner (Triton / ours)", "max error (Triton / ours)"]
  blocks = [method + "\n\n" + table(header, rows, "lrrrlll") + ("\n\n" + "\n".join(notes) if notes else "")]
  launch = results.get("launch")
  unavailable = launch_failure(launch)
  if unavailable:
    blocks.append(unavailable)
  else:
    us = launch["us_per_call"]
    blocks.append(
        f"Host cost per call of a small Triton kernel (`add_one`, 1024 floats): a jitted chain of {launch['chain']} "
        f"calls through `mosaic_kernel`, wall time per call, against Triton's eager `kernel[grid](...)` loop of "
        f"the same launches (wall time with the final synchronize; the enqueue alone in parentheses).\n\n" +
        table(["path", "us per call"], [["ours, jitted chain", sig(us["ours"])],
                                        ["Triton launcher, eager", f"{sig(us['triton_eager'])} "
                                                                   f"({sig(us['triton_enqueue'])})"],
                                        ["ours / Triton", f"**{fmt(us['ours'] / us['triton_eager'])}x**"]], "lr"))
  blocks.append("What reaches XLA from jax-triton's `triton_call` against ours for the same kernels: "
                "[docs/launch_parity.md](launch_parity.md#triton-kernels-jax-triton-and-ours).")
  return blocks
