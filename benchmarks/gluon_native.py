"""Gluon kernels as Triton's Gluon tutorials write them: through our runtime and through Triton's own launcher, in
one process.

The kernels (kernels/gluon_user.py) are the tutorials' Hopper GEMMs on TMA and wgmma: 05-wgmma's double-buffered
loop and 07-persistence's ring of buffers with the MMA an ``@aggregate`` class passed as a constexpr, both taking
``num_warps: gl.constexpr``. Each runs on the same inputs through `jmf.mosaic_kernel(jmf.gluon_kernel(...))` inside
`jax.jit`, its descriptors `jmf.TensorDescriptor` entries with Gluon layouts, and through Triton's launcher as the
tutorials call it: ``TensorDescriptor.from_tensor`` of torch tensors, then ``kernel[grid](a, b, c, ...,
num_warps=8)``. Both results are checked against a float32 torch reference first. Then the GPU time per call,
interleaved round by round, median, as benchmarks/triton_native.py measures it: ours between two GPU clock stamps
inside the jitted program (a chain of calls, each feeding the next), Triton's between two CUDA events on torch's
stream behind a sleep kernel, so that neither side's host launch speed counts.

The launch run measures the host cost per call of small Gluon kernels: a jitted chain of calls through jmf against
Triton's eager ``kernel[grid](...)`` loop, for an elementwise kernel and for a TMA kernel whose host descriptor
Triton's launcher encodes on every call (the tutorials' wrappers build it on every call too).
"""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Callable

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, launch_failure, sig, table
from benchmarks.suite import Run
from benchmarks import triton_native
from benchmarks.triton_native import SLEEP_CYCLES, stamped_chain

NAME = "gluon_native"
TITLE = "Gluon kernels as Triton's tutorials write them: our runtime against Triton's own launcher"
ORDER = 57
RUNS = (Run("gemm", kwargs={"cases": ("pipelined_4096", "ring_4096", "ring_8192")}, timeout_s=360),
        Run("launch", kwargs={"cases": ()}, timeout_s=150))

ROUNDS = 15
LAUNCH_CHAIN = 200
LAUNCH_N = 1024
TILE = (64, 64)

CASES = {
    "pipelined_4096": "05-wgmma double-buffered GEMM, 4096^3 fp16, 128x256x64 tiles",
    "ring_4096": "07-persistence ring GEMM (MMAImpl=WGMMA, 4 buffers), 4096^3 fp16, 128x256x64 tiles",
    "ring_8192": "07-persistence ring GEMM (MMAImpl=WGMMA, 4 buffers), 8192^3 fp16, 128x256x64 tiles",
}


@dataclasses.dataclass(frozen=True)
class Case:
  """One GEMM both ways: `ours(a, b)` on jax arrays, `theirs(a, b)` on torch tensors; a chain feeds each C to the
  next call as A (B is scaled by 1/sqrt(n), so values stay O(1))."""

  n: int
  ours: Callable
  theirs: Callable
  chain: int
  constexprs: dict


def environment(with_torch: bool = True) -> dict:
  """The modules a case needs (torch only to measure); raises ImportError naming what is missing."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import triton
  from triton.experimental.gluon import language as gl

  import jax_mosaic_ffi as jmf
  torch = hopper = None
  if with_torch:
    import torch
    from triton.experimental.gluon.nvidia import hopper
  from benchmarks.kernels import gluon_user as K
  return {"np": np, "jax": jax, "jnp": jnp, "jmf": jmf, "torch": torch, "triton": triton, "gl": gl, "K": K,
          "hopper": hopper}


def kernel_and_constexprs(name, K):
  if name.startswith("pipelined"):
    return K.blocked_matmul_pipelined, {}
  return K.matmul_pipelined, {"MMAImpl": K.WGMMA, "num_buffers": K.GEMM_BUFFERS}


def make_case(name, env) -> Case:
  jax, jnp, jmf, gl, K, triton = (env[k] for k in ("jax", "jnp", "jmf", "gl", "K", "triton"))
  n = int(name.rsplit("_", 1)[1])
  kernel, constexprs = kernel_and_constexprs(name, K)
  bm, bn, bk = (K.GEMM_TILE[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
  layouts = [gl.NVMMASharedLayout.get_default_for(block, gl.float16) for block in ([bm, bk], [bk, bn], [bm, bn])]
  TD = jmf.TensorDescriptor
  ours = jmf.mosaic_kernel(
      jmf.gluon_kernel(kernel, constexprs=constexprs, num_warps=K.GEMM_WARPS),
      lambda a, b: jax.ShapeDtypeStruct((a.shape[0], b.shape[1]), jnp.float16),
      grid=lambda meta, a, b: (jmf.cdiv(a.shape[0], bm), jmf.cdiv(b.shape[1], bn)),
      param_order=(TD.from_tensor("in0", [bm, bk], layout=layouts[0]),
                   TD.from_tensor("in1", [bk, bn], layout=layouts[1]),
                   TD.from_tensor("out0", [bm, bn], layout=layouts[2])))

  def theirs(a, b):  # as the tutorials' wrappers launch it: descriptors of torch tensors, built per call
    import torch
    hopper = env["hopper"]
    c = torch.empty((a.shape[0], b.shape[1]), device=a.device, dtype=torch.float16)
    descs = [hopper.TensorDescriptor.from_tensor(t, block, layout)
             for t, block, layout in zip((a, b, c), ([bm, bk], [bk, bn], [bm, bn]), layouts)]
    grid = (triton.cdiv(a.shape[0], bm), triton.cdiv(b.shape[1], bn))
    kernel[grid](*descs, *constexprs.values(), num_warps=K.GEMM_WARPS)
    return c
  return Case(n, ours, theirs, 5 if n <= 4096 else 2, constexprs)


# ------------------------------------------------------------------ measuring (in the child)

def _error(got, want) -> float:
  got, want = (x.astype("float64") for x in (got, want))
  return float(abs(got - want).max() / max(abs(want).max(), 1e-30))


def _measure_case(name, env, rounds):
  from jax_mosaic_ffi.transforms import gpu_clock
  np, jax, torch = env["np"], env["jax"], env["torch"]
  case = make_case(name, env)
  rng = np.random.default_rng()
  n = case.n
  inputs = [rng.standard_normal((n, n), np.float32).astype(np.float16),
            (rng.standard_normal((n, n), np.float32) / np.sqrt(n)).astype(np.float16)]
  tensors = [torch.from_numpy(x).to(torch.device("cuda")) for x in inputs]
  arrays = [jax.device_put(x) for x in inputs]
  ours_out = np.asarray(jax.jit(case.ours)(*arrays))
  theirs_out = case.theirs(*tensors).float().cpu().numpy()
  want = (tensors[0].float() @ tensors[1].float()).cpu().numpy()
  errors = {"ours": _error(ours_out, want), "triton": _error(theirs_out, want)}
  for side, error in errors.items():
    if not error <= 1e-2:
      raise AssertionError(f"{name}: {side} result is off by {error:.2e} of the largest element (tolerance 1e-02)")

  # What stamped_chain times: a chain of calls, each C the next call's A.
  chained = types.SimpleNamespace(chain=case.chain, ours=lambda a, b: (case.ours(a, b),),
                                  carry=lambda ins, outs: (outs[0], ins[1]))
  jitted = jax.jit(stamped_chain(chained))

  def ours_sample():
    start, stop, _ = jitted(*arrays)
    return gpu_clock.elapsed_s(start, stop) / case.chain

  def triton_sample():
    begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    if hasattr(torch.cuda, "_sleep"):  # holds the stream while the host enqueues the chain
      torch.cuda._sleep(SLEEP_CYCLES)
    begin.record()
    a, b = tensors
    for _ in range(case.chain):
      a = case.theirs(a, b)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3 / case.chain

  seconds = timing.interleaved_samples({"ours": ours_sample, "triton": triton_sample}, rounds)
  work = 2.0 * n ** 3
  return {"chain": case.chain, "rounds": rounds, "max_error": errors, "unit": "TFLOP/s", "work": work,
          "us": {k: s * 1e6 for k, s in seconds.items()},
          "throughput": {k: work / s / 1e12 for k, s in seconds.items()},
          "speed": seconds["triton"] / seconds["ours"]}  # ours relative to Triton's launcher: above 1 is faster


def _us_per_call(jitted, x, eager, torch) -> dict:
  ours, triton_eager, triton_enqueue = timing.host_cost_per_call(lambda: jitted(x).block_until_ready(), eager,
                                                                 LAUNCH_CHAIN, torch.cuda.synchronize)
  return {"ours": ours, "triton_eager": triton_eager, "triton_enqueue": triton_enqueue}


def _measure_launch(env) -> dict:
  np, jax, jnp, jmf, torch, gl, K = (env[k] for k in ("np", "jax", "jnp", "jmf", "torch", "gl", "K"))
  n = LAUNCH_N
  add_one = jmf.mosaic_kernel(jmf.gluon_kernel(K.add_one, constexprs={"BLOCK": n}), lambda x: x, grid=(1,),
                              scalars=(np.int32(n),))
  jitted = jax.jit(timing.chained(add_one, LAUNCH_CHAIN))
  x = jnp.zeros((n,), jnp.float32)
  if not np.all(np.asarray(jitted(x)) == LAUNCH_CHAIN):
    raise AssertionError("launch chain: ours did not add up")
  xt = torch.zeros(n, device="cuda")
  yt = torch.empty_like(xt)

  def eager(sync=True):
    a, b = xt, yt
    for _ in range(LAUNCH_CHAIN):
      K.add_one[(1,)](a, b, n, BLOCK=n, num_warps=4)
      a, b = b, a
    if sync:
      torch.cuda.synchronize()
  eager()
  if not torch.all(xt == LAUNCH_CHAIN):  # an even chain ends in xt
    raise AssertionError("launch chain: Triton's eager chain did not add up")
  result = {"chain": LAUNCH_CHAIN, "us_per_call": _us_per_call(jitted, x, eager, torch)}

  m, k = TILE
  layout = gl.NVMMASharedLayout.get_default_for([m, k], gl.float32)
  tile = jmf.mosaic_kernel(jmf.gluon_kernel(K.tile_add_one), lambda v: v, grid=(1,),
                           param_order=(jmf.TensorDescriptor.from_tensor("in0", [m, k], layout=layout), "out0"))
  tiled = jax.jit(timing.chained(tile, LAUNCH_CHAIN))
  v = jnp.zeros(TILE, jnp.float32)
  if not np.all(np.asarray(tiled(v)) == LAUNCH_CHAIN):
    raise AssertionError("TMA launch chain: ours did not add up")
  at, bt = torch.zeros(TILE, device="cuda"), torch.empty(TILE, device="cuda")

  def eager_tma(sync=True):  # as a tutorial's wrapper: the descriptor of this call's tensor, then the launch
    a, b = at, bt
    for _ in range(LAUNCH_CHAIN):
      K.tile_add_one[(1,)](env["hopper"].TensorDescriptor.from_tensor(a, [m, k], layout), b, num_warps=4)
      a, b = b, a
    if sync:
      torch.cuda.synchronize()
  eager_tma()
  if not torch.all(at == LAUNCH_CHAIN):
    raise AssertionError("TMA launch chain: Triton's eager chain did not add up")
  result["tma"] = {"us_per_call": _us_per_call(tiled, v, eager_tma, torch)}
  return result


def run(cases=(), rounds: int = ROUNDS) -> dict:
  os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")  # two allocators share the GPU
  try:
    env = environment()
  except ImportError as e:
    return {"skipped": f"needs torch and triton (with Gluon) beside jax ({e})"}
  if env["jax"].default_backend() != "gpu" or not env["torch"].cuda.is_available():
    return {"skipped": "needs a GPU visible to both jax and torch"}
  capability = env["torch"].cuda.get_device_capability()
  if cases and capability[0] != 9:
    return {"skipped": f"the tutorials' wgmma GEMMs need an sm_90 GPU; this one is sm_{capability[0]}{capability[1]}"}
  return triton_native.measure(env, cases, rounds, _measure_case, _measure_launch)


# ------------------------------------------------------------------ the report (no jax)

def tables(results: dict) -> list[str]:
  rows, notes = [], []
  r = results.get("gemm")
  why = failure(r)
  if why:
    notes.append(f"- gemm: n/a: {why}")
  else:
    for name, error in r.get("errors", {}).items():
      rows.append([CASES.get(name, name), "n/a", "n/a", "n/a", last_line(error)[:120]])
    for name, c in r["cases"].items():
      rows.append([CASES.get(name, name), f"{sig(c['us']['triton'])} ({sig(c['throughput']['triton'])})",
                   f"{sig(c['us']['ours'])} ({sig(c['throughput']['ours'])})", f"**{fmt(c['speed'])}x**",
                   f"{c['max_error']['triton']:.1e} / {c['max_error']['ours']:.1e}"])
  method = (
      "Gluon GEMMs written as Triton's Gluon tutorials write them (`benchmarks/kernels/gluon_user.py`: TMA host "
      "descriptors, wgmma, `num_warps: gl.constexpr`, 07's `MMAImpl=WGMMA` aggregate), run in one process through "
      "`mosaic_kernel(gluon_kernel(...))` inside `jax.jit` and through Triton's own launcher on torch tensors "
      "(descriptors built per call, as the tutorials' wrappers do), same inputs, both checked against float32 torch "
      "first. GPU time per call in microseconds (TFLOP/s): ours between two GPU clock stamps inside the jitted "
      "program, Triton's between two CUDA events behind a sleep kernel; a chain of calls, each C the next A, "
      "medians of interleaved rounds. Ratio above 1: ours is faster.")
  header = ["kernel", "Triton launcher us (TFLOP/s)", "ours us (TFLOP/s)", "ours / Triton", "max error (Triton / ours)"]
  blocks = [method + "\n\n" + table(header, rows, "lrrrl") + ("\n\n" + "\n".join(notes) if notes else "")]
  launch = results.get("launch")
  unavailable = launch_failure(launch)
  if unavailable:
    blocks.append(unavailable)
  else:
    launch_rows = []
    for label, us in (("elementwise `add_one`, 1024 floats", launch["us_per_call"]),
                      ("TMA `tile_add_one`, a 64x64 host descriptor", launch.get("tma", {}).get("us_per_call"))):
      if us:
        launch_rows.append([label, sig(us["ours"]), f"{sig(us['triton_eager'])} ({sig(us['triton_enqueue'])})",
                            f"**{fmt(us['ours'] / us['triton_eager'])}x**"])
    blocks.append(
        f"Host cost per call of small Gluon kernels: a jitted chain of {launch['chain']} calls through "
        "`mosaic_kernel`, wall time per call, against Triton's eager `kernel[grid](...)` loop of the same launches "
        "(wall time with the final synchronize; the enqueue alone in parentheses; the TMA kernel's descriptor built "
        "per call, as the tutorials' wrappers do).\n\n" +
        table(["kernel", "ours us", "Triton launcher, eager us", "ours / Triton (below 1: ours costs less)"],
              launch_rows, "lrrr"))
  return blocks
