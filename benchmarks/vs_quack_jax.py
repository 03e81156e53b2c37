"""quack's softmax in JAX: quack's own binding against the same CuTe DSL kernel through jax_mosaic_ffi.

quack-kernels ships a JAX binding of its softmax, `quack.softmax_jax.softmax`: its `Softmax` and `SoftmaxBackward`
classes compiled with `cute.compile(..., options="--enable-tvm-ffi")` (quack's own disk cache, `QUACK_CACHE_DIR`),
each specialization registered in the process as an FFI target of its own through jax-tvm-ffi, and a
`jax.custom_vjp`. Ours is kernels/quack_user.py: the same two classes, unchanged, each in a three-line `@cute.jit`
launcher called by `jmf.cute_call`, the gradient through `jmf.differentiable`.

- `lowering` (no GPU needed): per side, a first process with empty caches (ours, quack's and the DSL's) and a second
  with the first one's; each lowers the forward and the gradient for CUDA twice (a new function the second time),
  then exports the forward: the lowering times, the serialized `jax.export` artifact's size and the kernel code
  the custom call carries; then what `jax.vmap` of each lowers to.
- `gpu`: in one process, both sides' forward, gradient and `jax.vmap` results checked against numpy, then GPU time
  per call of the forward and of forward plus backward (the GPU clock around a jitted chain, medians of
  interleaved rounds), host cost per call (wall time of a jitted chain of small softmaxes), and each side's
  exported forward called in a fresh process that imports the side's package but never traced the kernel.

quack imports torch (its own torch ops live beside the JAX binding), so both sides need it; where quack does not
import, the run is n/a. By hand, one side at a time, printing JSON:

    python -m benchmarks.vs_quack_jax lowering quack|jmf
    python -m benchmarks.vs_quack_jax exported quack|jmf FILE
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, sig, table
from benchmarks.suite import Run, json_child

NAME = "vs_quack_jax"
TITLE = "quack's softmax in JAX: quack's own binding (jax-tvm-ffi) and jax_mosaic_ffi"
ORDER = 59
RUNS = (Run("lowering", kwargs={"which": "lowering"}, timeout_s=400.0, optional=True),
        Run("gpu", kwargs={"which": "gpu"}, timeout_s=400.0, optional=True))

SIDES = ("quack", "jmf")
LABELS = {"quack": "quack.softmax_jax", "jmf": "jax_mosaic_ffi"}
ROWS, COLS = 16384, 8192        # the timed softmax, bf16
WIDE = (4096, 32768)            # a row long enough that quack's forward launches 2-CTA clusters
SMALL = (256, 1024)             # the host cost's softmax
BATCH = (4, 1024, 4096)         # jax.vmap
EXPORTED = (2048, 4096)         # the exported forward
CHAIN = 200
CALLS = 20  # per timed program
CASES = {"forward": f"softmax {ROWS}x{COLS} bf16", "wide": f"softmax {WIDE[0]}x{WIDE[1]} bf16 (2-CTA clusters)",
         "grad": f"softmax forward + backward (`jax.grad`) {ROWS}x{COLS} bf16"}


def softmax(side: str):
  """The user's softmax: quack's binding, or ours over the same kernels."""
  if side == "quack":
    from quack.softmax_jax import softmax as quack_softmax
    return quack_softmax
  from benchmarks.kernels import quack_user
  return quack_user.softmax


def _versions() -> dict:
  from importlib import metadata
  out = {}
  for name in ("jax", "nvidia-cutlass-dsl", "quack-kernels", "jax-tvm-ffi", "apache-tvm-ffi", "torch"):
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = "not installed"
  return out


def _loss(fn):
  import jax.numpy as jnp
  return lambda x, w: (fn(x).astype(jnp.float32) * w).sum()


# ------------------------------------------------------------------ lowering, in fresh processes

def _carried(lowered) -> dict:
  """The custom calls: their targets and the bytes of kernel code their attributes carry."""
  from benchmarks.hlo_inspect import custom_calls
  calls = custom_calls(lowered)
  return {"targets": sorted({c["target"] for c in calls}),
          "attribute_bytes": sum(len(v) for c in calls for v in c["config"].values() if isinstance(v, bytes))}


def lower_side(side: str) -> dict:
  """In this process: the forward and the gradient lowered twice each, the forward exported, vmap lowered."""
  import jax
  import jax.numpy as jnp
  rows = jax.ShapeDtypeStruct((ROWS, COLS), jnp.bfloat16)
  weights = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32)
  out = {}
  for name in ("forward", "grad"):
    seconds = []
    for _ in range(2):  # a new function each time: jax traces again, only the libraries' caches can hit
      fn = softmax(side)
      program = (lambda x, fn=fn: fn(x)) if name == "forward" else jax.grad(_loss(fn))
      avals = (rows,) if name == "forward" else (rows, weights)
      start = time.perf_counter()
      lowered = jax.jit(program).trace(*avals).lower(lowering_platforms=("cuda",))
      seconds.append(time.perf_counter() - start)
    out[name] = {"lower_s": seconds, **_carried(lowered)}
  fn = softmax(side)
  if side == "jmf":
    import jax_mosaic_ffi as jmf
    disabled = jmf.export_disabled_checks()
  else:  # quack's targets are its own, registered per process: jax.export refuses them unless told
    disabled = [jax.export.DisabledSafetyCheck.custom_call(t) for t in out["forward"]["targets"]]
  exported = jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=disabled)(rows)
  out["export_bytes"] = len(exported.serialize())
  try:
    lowered = jax.jit(jax.vmap(fn)).trace(jax.ShapeDtypeStruct(BATCH, jnp.bfloat16)).lower(
        lowering_platforms=("cuda",))
    out["vmap"] = _carried(lowered)
  except Exception as e:
    out["vmap"] = {"error": f"{type(e).__name__}: {last_line(str(e))[:300]}"}
  return out


def _child(args, env, timeout=300) -> dict:
  return json_child("import sys; from benchmarks import vs_quack_jax as b; sys.exit(b.main(sys.argv[1:]))", args,
                    env, timeout)


def _lowering() -> dict:
  result = {"versions": _versions()}
  for side in SIDES:
    # A first process with empty caches (ours, quack's, the DSL's), then a second one with the first one's.
    with tempfile.TemporaryDirectory(prefix="jmf-vs-quack-") as caches:
      env = {"JAX_MOSAIC_FFI_CACHE_DIR": os.path.join(caches, "jmf"),
             "QUACK_CACHE_DIR": os.path.join(caches, "quack"),
             "CUTE_DSL_CACHE_DIR": os.path.join(caches, "cute_dsl"), "JAX_PLATFORMS": "cpu"}
      try:
        result[side] = {"first": _child(["lowering", side], env), "second": _child(["lowering", side], env)}
      except Exception as e:  # a side that cannot run here is its columns' n/a
        result[side] = {"error": last_line(str(e))}
  return result


# ------------------------------------------------------------------ on the GPU

def _gpu() -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from jax_mosaic_ffi.transforms import gpu_clock
  if jax.default_backend() != "gpu":
    return {"skipped": "needs a GPU"}
  sides, errors = {}, {}
  for side in SIDES:
    try:
      sides[side] = softmax(side)
    except Exception as e:
      errors[side] = f"{type(e).__name__}: {e}"
  if not sides:  # quack is missing, or neither binding works: nothing to measure (and no reference to import)
    return {"error": "no side could be built\n" + "; ".join(f"{side}: {e}" for side, e in errors.items())}
  rng = np.random.default_rng()

  def bf16(shape):
    return rng.standard_normal(shape, np.float32).astype(jnp.bfloat16)

  from benchmarks.kernels.quack_user import softmax_reference as reference
  result = {"cases": {}, "checks": {}, "errors": errors, "versions": _versions()}
  for name, shape in (("forward", (ROWS, COLS)), ("wide", WIDE), ("grad", (ROWS, COLS))):
    x = bf16(shape)
    w = rng.standard_normal(shape, np.float32)
    arrays = [jax.device_put(x)] + ([jax.device_put(w)] if name == "grad" else [])
    if name == "grad":  # d/dx sum(w * softmax(x)) = y * (w - sum(w * y))
      y = reference(x)
      want = y * (w - (w * y).sum(-1, keepdims=True))
    else:
      want = reference(x)
    timed, checked = {}, {}
    for side, fn in sides.items():
      try:
        program = jax.grad(_loss(fn)) if name == "grad" else fn
        got = np.asarray(jax.jit(program)(*arrays), np.float64)
        checked[side] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        if not checked[side] <= 2e-2:
          raise AssertionError(f"{name} through {side} is off by {checked[side]:.1e}")
        timed[side] = timing.stamped_sampler(jax.jit(gpu_clock.timed(gpu_clock.repeated(program, CALLS))), arrays,
                                             CALLS)
      except Exception as e:
        errors[f"{name}/{side}"] = f"{type(e).__name__}: {str(e)[:1500]}"
    seconds = timing.interleaved_samples(timed, 15)
    result["cases"][name] = {"us": {side: s * 1e6 for side, s in seconds.items()}, "max_error": checked}
  result["checks"]["vmap"] = _vmap(sides, bf16, reference)
  result["checks"]["exported"] = _exported(sides, bf16)
  result["host"] = _host_cost(sides, errors, bf16)
  return result


def _vmap(sides, bf16, reference) -> dict:
  """Each side's jax.vmap over a batch of softmaxes: its error against numpy, or what it raised."""
  import jax
  import numpy as np
  x = bf16(BATCH)
  out = {}
  for side, fn in sides.items():
    try:
      got = np.asarray(jax.jit(jax.vmap(fn))(jax.device_put(x)), np.float64)
      out[side] = {"max_error": float(np.abs(got - reference(x)).max())}
    except Exception as e:
      out[side] = {"error": f"{type(e).__name__}: {last_line(str(e))[:300]}"}
  return out


def _exported(sides, bf16) -> dict:
  """Each side's exported forward, called in a fresh process that imports the side's package only."""
  import jax
  import jax.numpy as jnp
  out = {}
  aval = jax.ShapeDtypeStruct(EXPORTED, jnp.bfloat16)
  for side, fn in sides.items():
    try:
      if side == "jmf":
        import jax_mosaic_ffi as jmf
        disabled = jmf.export_disabled_checks()
      else:
        targets = _carried(jax.jit(fn).trace(aval).lower())["targets"]
        disabled = [jax.export.DisabledSafetyCheck.custom_call(t) for t in targets]
      data = jax.export.export(jax.jit(fn), platforms=["cuda"], disabled_checks=disabled)(aval).serialize()
      with tempfile.NamedTemporaryFile(prefix="jmf-vs-quack-", suffix=".jax") as f:
        f.write(data)
        f.flush()
        out[side] = _child(["exported", side, f.name], {}, timeout=200)
    except Exception as e:
      out[side] = {"error": f"{type(e).__name__}: {last_line(str(e))[:300]}"}
  return out


def call_exported(side: str, path: str) -> dict:
  """In a fresh process: the side's package imported, its exported forward deserialized and called."""
  import jax
  import numpy as np
  if side == "jmf":
    import jax_mosaic_ffi  # noqa: F401  (our FFI targets)
  else:
    import quack.softmax_jax  # noqa: F401
  from benchmarks.kernels.quack_user import softmax_reference
  with open(path, "rb") as f:
    exported = jax.export.deserialize(bytearray(f.read()))
  x = np.random.default_rng().standard_normal(EXPORTED, np.float32).astype(exported.in_avals[0].dtype)
  start = time.perf_counter()
  try:
    got = np.asarray(exported.call(jax.device_put(x)), np.float64)
  except Exception as e:
    return {"error": f"{type(e).__name__}: {last_line(str(e))[:300]}"}
  return {"first_call_s": time.perf_counter() - start,
          "max_error": float(np.abs(got - softmax_reference(x)).max())}


def _host_cost(sides, errors, bf16) -> dict:
  """Wall time per call of a jitted chain of CHAIN small softmaxes, both sides interleaved."""
  import jax

  chains = {}
  x = jax.device_put(bf16(SMALL))
  for side, fn in sides.items():
    program = jax.jit(timing.chained(fn, CHAIN))
    try:
      program(x).block_until_ready()
      chains[side] = lambda program=program: program(x).block_until_ready()
    except Exception as e:
      errors[f"host/{side}"] = f"{type(e).__name__}: {str(e)[:1500]}"
  return timing.host_us_per_call(chains, CHAIN)


def run(which: str) -> dict:
  return _lowering() if which == "lowering" else _gpu()


# ------------------------------------------------------------------ the report (no jax)

def _outcome(entry: dict) -> str:
  if "error" in entry:
    return f"fails: {entry['error'][:160]}"
  return f"matches numpy (max error {entry['max_error']:.1e})"


def tables(results: dict) -> list[str]:
  blocks = []
  low = results.get("lowering")
  why = failure(low)
  if why:
    blocks.append(f"Lowering: n/a: {why}")
  else:
    rows = []
    for side in SIDES:
      s = low.get(side, {})
      if "error" in s:
        rows.append([LABELS[side], "n/a", "n/a", "n/a", "n/a", "n/a", last_line(s["error"])[:120]])
        continue
      first, second = s["first"], s["second"]
      fwd, vmap = first["forward"], first["vmap"]
      rows.append([LABELS[side], f"{fmt(fwd['lower_s'][0])} / {fmt(fwd['lower_s'][1])}",
                   fmt(second["forward"]["lower_s"][0]),
                   f"{fmt(first['grad']['lower_s'][0])} / {fmt(second['grad']['lower_s'][0])}",
                   f"{first['export_bytes'] / 1e3:.1f} kB",
                   f"{fwd['attribute_bytes'] / 1e3:.1f} kB in `{', '.join(fwd['targets'])}`",
                   vmap.get("error") or f"`{', '.join(vmap['targets'])}`"])
    versions = ", ".join(f"{k} {v}" for k, v in low.get("versions", {}).items())
    blocks.append(
        f"The same softmax ({CASES['forward']}) lowered for CUDA in processes that see no GPU, through quack's "
        "binding and through ours: seconds to lower the forward in a first process with empty caches (first "
        "lowering / again in the same process, a new function) and in a second process with the first one's "
        "caches; the gradient the same way (first process / second); the serialized `jax.export` artifact of the "
        f"forward; the kernel code its custom call carries; what `jax.vmap` over {BATCH[0]} lowers to "
        f"({versions}).\n\n" +
        table(["side", "forward: lower s (cold / again)", "2nd process", "grad: lower s (cold / 2nd process)",
               "export", "kernel code in the custom call", "vmap"], rows, "lrrrrll"))
  gpu_ = results.get("gpu")
  why = failure(gpu_)
  if why:
    blocks.append(f"GPU time, host cost, vmap and export: n/a: {why}")
    return blocks
  rows = []
  for name, c in gpu_.get("cases", {}).items():
    us = c.get("us", {})
    ours, theirs = us.get("jmf"), us.get("quack")
    rows.append([CASES[name], sig(theirs) if theirs else "n/a", sig(ours) if ours else "n/a",
                 f"**{fmt(theirs / ours)}x**" if ours and theirs else "n/a"])
  host = gpu_.get("host", {}).get("us_per_call", {})
  ours, theirs = host.get("jmf"), host.get("quack")
  rows.append([f"host cost per call, jitted chain of {CHAIN} softmaxes {SMALL[0]}x{SMALL[1]} (wall us)",
               sig(theirs) if theirs else "n/a", sig(ours) if ours else "n/a",
               f"**{fmt(theirs / ours)}x**" if ours and theirs else "n/a"])
  checks = gpu_.get("checks", {})
  for key, label in (("vmap", f"`jax.vmap` over {BATCH[0]} softmaxes"),
                     ("exported", "exported forward, called in a fresh process")):
    entries = checks.get(key, {})
    rows.append([label, _outcome(entries["quack"]) if "quack" in entries else "n/a",
                 _outcome(entries["jmf"]) if "jmf" in entries else "n/a", ""])
  notes = "".join(f"\n- {k}: n/a: {last_line(v)[:200]}" for k, v in gpu_.get("errors", {}).items())
  versions = ", ".join(f"{k} {v}" for k, v in gpu_.get("versions", {}).items())
  blocks.append(
      "GPU microseconds per call of quack's softmax through each (the GPU clock around a jitted chain of 20 calls, "
      "median of 15 interleaved rounds, after both sides' results were checked against numpy), the host's wall time "
      "per call of a jitted chain of small softmaxes, and what `jax.vmap` and `jax.export` give "
      f"({versions or 'versions not recorded'}). Ratio above 1: ours is faster.\n\n" +
      table(["", "quack.softmax_jax", "jax_mosaic_ffi", "quack / ours"], rows, "lrrr") + notes)
  return blocks


def main(argv=None) -> int:
  """By hand, or a run's child: ``lowering quack|jmf`` or ``exported quack|jmf FILE`` prints its JSON."""
  argv = sys.argv[1:] if argv is None else argv
  if len(argv) == 2 and argv[0] == "lowering" and argv[1] in SIDES:
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    print("CHILD " + json.dumps(lower_side(argv[1])))
    return 0
  if len(argv) == 3 and argv[0] == "exported" and argv[1] in SIDES:
    print("CHILD " + json.dumps(call_exported(argv[1], argv[2])))
    return 0
  print(__doc__)
  return 2


if __name__ == "__main__":
  sys.exit(main())
