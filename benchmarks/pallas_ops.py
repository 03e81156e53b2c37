"""jax_mosaic_ffi.ops.gpu against the kernels it replaces: jax 0.11's Pallas GPU ops (and cuDNN for attention).

jax 0.12 removed `jax.experimental.pallas.ops.gpu`'s Triton kernels; `jax_mosaic_ffi.ops.gpu` gives them back
with the same names and arguments, on our own Triton kernels. Each case runs the same call on the same inputs:

- `ours`: `jax_mosaic_ffi.ops.gpu.<module>.<op>`, autotuned (its defaults), inside `jax.jit`;
- `pallas`: `jax.experimental.pallas.ops.gpu.<module>.<op>` with its defaults, where the jax running here still
  ships it (0.11; with 0.12 the rows say so);
- `cudnn` (attention only): `jax.nn.dot_product_attention(..., implementation="cudnn")`.

Forward, and for the ops with a gradient forward + backward (`grad`: the cotangents of every differentiable
input, through `jax.vjp`). Each side is checked against the op's jax.numpy reference first (the largest error
relative to the largest element), then timed: GPU time between two GPU clock stamps inside the jitted program
(a chain of calls), medians of interleaved rounds. By hand: `python -m benchmarks --only pallas_ops`.
"""

from __future__ import annotations

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, sig, table
from benchmarks.suite import Run

NAME = "pallas_ops"
TITLE = "Pallas's GPU ops (removed in jax 0.12) on our Triton kernels, against jax 0.11's Pallas and cuDNN"
ORDER = 61
RUNS = (Run("gpu", timeout_s=590.0, optional=True),)

SIDES = ("ours", "pallas", "cudnn")
LABELS = {"ours": "jax_mosaic_ffi.ops.gpu", "pallas": "jax 0.11 Pallas", "cudnn": "cuDNN (jax.nn)"}
CHAIN = 10
ROUNDS = 15
# name: (module, description, shapes...)
CASES = {
    "mha_causal_d128": ("attention", "mha causal, batch 4, seqlen 4096, 16 heads, head dim 128", (4, 4096, 16, 128),
                        True),
    "mha_full_d128": ("attention", "mha, batch 4, seqlen 4096, 16 heads, head dim 128", (4, 4096, 16, 128), False),
    "mha_causal_d64": ("attention", "mha causal, batch 8, seqlen 2048, 16 heads, head dim 64", (8, 2048, 16, 64),
                       True),
    "gqa": ("decode_attention", "gqa, batch 16, 32 query / 8 kv heads, 8192 keys, head dim 128",
            (16, 32, 8, 8192, 128)),
    "gqa_lengths": ("decode_attention", "gqa with kv_seq_len (7000 to 8192 keys), as gqa", (16, 32, 8, 8192, 128),
                    True),
    "mqa": ("decode_attention", "mqa, batch 16, 32 heads, 8192 keys, head dim 128", (16, 32, 1, 8192, 128)),
    "paged": ("paged_attention", "paged, batch 16, 32 query / 8 kv heads, 512 pages of 16, head dim 128",
              (16, 32, 8, 512, 16, 128)),
    "layer_norm": ("layer_norm", "layer_norm, (8, 4096, 4096)", (8, 4096, 4096)),
    "rms_norm": ("rms_norm", "rms_norm, (8, 4096, 4096)", (8, 4096, 4096)),
    "softmax": ("softmax", "softmax, (16384, 4096)", (16384, 4096)),
}
GRADS = {"attention": (0, 1, 2), "layer_norm": (0, 1, 2), "rms_norm": (0, 1, 2)}


def _inputs(name: str, rng):
  """bf16 inputs of the case, as numpy-made jax arrays."""
  import jax.numpy as jnp
  import numpy as np
  module, _, shape, *_ = CASES[name]
  normal = lambda *s: jnp.asarray(rng.standard_normal(s, np.float32)).astype(jnp.bfloat16)  # noqa: E731
  if module == "attention":
    return [normal(*shape) for _ in range(3)]
  if module == "decode_attention":
    b, hq, hkv, s, d = shape
    kv = (b, s, d) if hkv == 1 else (b, s, hkv, d)
    return [normal(b, hq, d), normal(*kv), normal(*kv)]
  if module == "paged_attention":
    b, hq, hkv, pages, page, d = shape
    tables = jnp.asarray(rng.permutation(b * pages).reshape(b, pages), jnp.int32)
    lengths = jnp.full((b,), pages * page, jnp.int32)
    return [normal(b, hq, d), normal(hkv, b * pages, page, d), normal(hkv, b * pages, page, d), tables, lengths]
  if module in ("layer_norm", "rms_norm"):
    return [normal(*shape), normal(shape[-1]), normal(shape[-1])]
  return [normal(*shape)]


def _ops(name: str) -> dict:
  """side -> (function of the inputs, or the reason it cannot run); and the reference."""
  import importlib

  import jax
  import jax.numpy as jnp

  from jax_mosaic_ffi.ops import gpu as ours_package
  module, _, shape, *extra = CASES[name]
  ours_module = getattr(ours_package, module)
  try:
    pallas_module = importlib.import_module(f"jax.experimental.pallas.ops.gpu.{module}")
  except ImportError as e:
    pallas_module = f"jax {jax.__version__} ships no jax.experimental.pallas.ops.gpu.{module} ({e})"
  sides, reference = {}, None
  if module == "attention":
    causal, scale = extra[0], shape[-1] ** -0.5
    call = lambda m: (lambda q, k, v: m.mha(q, k, v, None, sm_scale=scale, causal=causal))  # noqa: E731
    sides["cudnn"] = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal,
                                                                  implementation="cudnn")
    reference = lambda q, k, v: ours_module.mha_reference(q, k, v, None, sm_scale=scale, causal=causal)  # noqa: E731
  elif module == "decode_attention":
    op = "mqa" if shape[2] == 1 else "gqa"
    call = lambda m: getattr(m, op)  # noqa: E731
    reference = getattr(ours_module, f"{op}_reference")
    if extra and extra[0]:  # with lengths: the same call given each sequence's length
      lengths = jnp.asarray(7000 + (jnp.arange(shape[0]) * 1192) // max(shape[0] - 1, 1), jnp.int32)
      call = lambda m: (lambda q, k, v: getattr(m, op)(q, k, v, kv_seq_len=lengths))  # noqa: E731
      reference = lambda q, k, v: getattr(ours_module, f"{op}_reference")(q, k, v, kv_seq_len=lengths)  # noqa: E731
  elif module == "paged_attention":
    call = lambda m: m.paged_attention  # noqa: E731

    def reference(q, k_pages, v_pages, tables, lengths):
      dense = lambda p: jnp.moveaxis(p[:, tables], 0, 3).reshape(tables.shape[0], -1, *p.shape[::3])  # noqa: E731
      return ours_module.paged_attention_reference(q, dense(k_pages), dense(v_pages), lengths)
  elif module in ("layer_norm", "rms_norm"):
    call = lambda m: getattr(m, module)  # noqa: E731
    reference = getattr(ours_module, f"{module}_reference")
  else:
    call = lambda m: m.softmax  # noqa: E731
    reference = ours_module.softmax_reference
  sides["ours"] = call(ours_module)
  sides["pallas"] = pallas_module if isinstance(pallas_module, str) else call(pallas_module)
  return {side: sides[side] for side in SIDES if side in sides}, reference


def _graded(fn, grads):
  import jax

  def vjp(*args):
    primal = lambda *d: fn(*(d[grads.index(i)] if i in grads else a for i, a in enumerate(args)))  # noqa: E731
    out, pull = jax.vjp(primal, *(args[i] for i in grads))
    return pull(out)  # the output itself as the cotangent: no extra input to make
  return vjp


def _error(got, want) -> float:
  import jax
  import numpy as np
  worst = 0.0
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    g, w = np.asarray(g, np.float32), np.asarray(w, np.float32)
    worst = max(worst, float(np.max(np.abs(g - w)) / max(float(np.max(np.abs(w))), 1e-30)))
  return worst


def _measure(name: str, mode: str, errors: dict) -> dict:
  import jax
  import numpy as np

  from jax_mosaic_ffi.transforms import gpu_clock
  module = CASES[name][0]
  inputs = [jax.device_put(a) for a in _inputs(name, np.random.default_rng())]
  sides, reference = _ops(name)
  if mode == "grad":
    grads = GRADS[module]
    sides = {side: (fn if isinstance(fn, str) else _graded(fn, grads)) for side, fn in sides.items()
             if side != "pallas" or module != "softmax"}
    reference = _graded(reference, grads)
  want = jax.jit(reference)(*[a.astype(np.float32) if a.dtype == "bfloat16" else a for a in inputs])
  key = name if mode == "forward" else f"{name}/grad"
  samplers, checked = {}, {}
  for side, fn in sides.items():
    if isinstance(fn, str):
      errors[f"{key}/{side}"] = f"skipped: {fn}"
      continue
    try:
      checked[side] = _error(jax.jit(fn)(*inputs), want)
      if not checked[side] <= (2e-2 if mode == "forward" else 5e-2):
        raise AssertionError(f"off by {checked[side]:.1e} of the reference's largest element")
      samplers[side] = timing.stamped_sampler(jax.jit(gpu_clock.timed(gpu_clock.repeated(fn, CHAIN))), inputs,
                                              CHAIN)
    except Exception as e:
      errors[f"{key}/{side}"] = f"{type(e).__name__}: {str(e)[:1500]}"
  us = {side: s * 1e6 for side, s in timing.interleaved_samples(samplers, ROUNDS).items()}
  return {"us": us, "max_error": checked}


def run() -> dict:
  import importlib.metadata as metadata

  import jax
  if jax.default_backend() != "gpu":
    return {"skipped": "needs a GPU"}
  errors, cases = {}, {}
  for name, (module, *_) in CASES.items():
    try:
      cases[name] = {"forward": _measure(name, "forward", errors)}
      if module in GRADS:
        cases[name]["grad"] = _measure(name, "grad", errors)
    except Exception as e:
      errors[name] = f"{type(e).__name__}: {str(e)[:1500]}"
  versions = {}
  for package in ("jax", "jaxlib", "triton"):
    try:
      versions[package] = metadata.version(package)
    except metadata.PackageNotFoundError:
      versions[package] = "not installed"
  return {"cases": cases, "errors": errors, "versions": versions, "chain": CHAIN, "rounds": ROUNDS}


# ------------------------------------------------------------------ the report (no jax)

def tables(results: dict) -> list[str]:
  gpu_ = results.get("gpu")
  why = failure(gpu_)
  if why:
    return [f"n/a: {why}"]
  rows = []
  for name, modes in gpu_.get("cases", {}).items():
    for mode, m in modes.items():
      us = m.get("us", {})
      cells = [f"{sig(us[s])} us" if s in us else "n/a" for s in SIDES]
      ours = us.get("ours")
      ratios = [f"**{fmt(us[s] / ours)}x**" if ours and s in us else "n/a" for s in ("pallas", "cudnn")]
      rows.append([f"{CASES[name][1]}{' (forward + backward)' if mode == 'grad' else ''}", *cells, *ratios])
  notes = "".join(f"\n- {k}: n/a: {last_line(v)[:200]}" for k, v in gpu_.get("errors", {}).items())
  versions = ", ".join(f"{k} {v}" for k, v in gpu_.get("versions", {}).items())
  header = ["case (bf16)", *(LABELS[s] for s in SIDES), "Pallas / ours", "cuDNN / ours"]
  return [
      "GPU time per call of each op of `jax_mosaic_ffi.ops.gpu` (autotuned), of the same op under jax 0.11's "
      "Pallas (its defaults) and, for attention, of cuDNN through `jax.nn.dot_product_attention`, inside "
      f"`jax.jit`: medians of {gpu_.get('rounds', ROUNDS)} interleaved rounds of a chain of "
      f"{gpu_.get('chain', CHAIN)} calls, each side checked against the op's reference first "
      f"({versions or 'versions not recorded'}). Ratios above 1: ours is faster.\n\n" +
      table(header, rows, "lrrrrr") + notes]
