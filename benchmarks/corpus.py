"""Corpus kernels against XLA: the CUDA C++ corpus (kernels/corpus/*.cu) through mosaic_kernel under
jax.jit, each against the same operation written in jax.numpy, at sizes
typical for it. Informational: no goals read this.

The kernels, their launch recipes and their input makers are the cases of
kernels/cuda_corpus.py, which tests/test_real_kernels.py runs too. Those recipes
are written for the tests' small shapes, held in module constants (GELU_SHAPE,
SG_M, ...) that the recipes and input makers read when called; the benchmark
sets those constants while it builds each program, then puts them back.

Each side is a jitted chain of CHAIN calls on the same inputs with an
optimization barrier between calls: the barrier ties a call's inputs to the
previous call's outputs, so XLA can neither merge the calls (CSE), nor fuse
one into the next, nor run them out of order, and every call's outputs are
returned so none is dropped. Per-call time is a host-timed median of whole
chains over CHAIN, ours and XLA's interleaved round after round.
"""

from __future__ import annotations

import contextlib
import dataclasses
import traceback

from benchmarks import timing
from benchmarks.markdown import failure, fmt, last_line, ratio, sig, table
from benchmarks.suite import Run

NAME = "corpus"
TITLE = "Corpus kernels against XLA"
ORDER = 60
RUNS = (Run("main"),)

CHAIN = 10
ROUNDS = 20


@dataclasses.dataclass(frozen=True)
class Bench:
  """One corpus case at a benchmark size, and its XLA equivalents."""

  case: str        # the Case's name in kernels/cuda_corpus.py
  sizes: dict      # that module's size constants, set while the recipe and inputs are made
  label: str
  size: str        # the size, as the table says it
  xla: tuple       # ((row key, what XLA runs, tolerance on max |ours - XLA| / max |XLA|), ...)
  flops: str = ""  # for a compute-bound kernel: FLOPS's key; else the rate is bytes moved


# Tolerances are loose on purpose: they catch a wrong result, not a rounding difference.
BENCHES = (
    Bench("GELU", {"GELU_SHAPE": (8192, 4096)}, "GELU tanh, bf16 (gelu_bf16.cu)", "8192x4096 bf16",
          (("gelu", "jax.nn.gelu(approximate=True) in bf16", 2e-2),)),
    Bench("LAYERNORM", {"LN_ROWS": 4096, "LN_C": 4096}, "LayerNorm forward, out/mean/rstd (layernorm_forward.cu)",
          "4096x4096 fp32", (("layernorm", "jnp layernorm returning out, mean, rstd", 1e-3),)),
    Bench("SOFTMAX", {"SM_ROWS": 4096, "SM_C": 4096}, "online softmax (softmax_online.cu)", "4096x4096 fp32",
          (("softmax", "jax.nn.softmax", 1e-3),)),
    Bench("SGEMM", {"SG_M": 2048, "SG_N": 2048, "SG_K": 2048}, "tiled SGEMM, alpha A @ B (sgemm_smem.cu)",
          "2048^3 fp32",
          (("sgemm", "alpha * jnp.matmul, precision=HIGHEST (fp32)", 1e-3),
           ("sgemm_tf32", "alpha * jnp.matmul, default precision (TF32 where XLA chooses it)", 2e-2)),
          flops="gemm"),
    Bench("WMMA", {"WM_M": 2048, "WM_N": 2048, "WM_K": 2048}, "WMMA GEMM + bias, fp16 in, fp32 out (wmma_gemm.cu)",
          "2048^3 fp16", (("wmma", "jnp.matmul(preferred_element_type=float32) + bias", 1e-3),), flops="gemm"),
    # AT_D stays 64: the kernel is instantiated with HEAD_DIM = 64
    Bench("ATTENTION", {"AT_B": 4, "AT_H": 8, "AT_T": 1024}, "causal attention forward (attention_forward.cu)",
          "B=4 H=8 T=1024 D=64 fp32",
          (("attention", "jnp einsum, mask, jax.nn.softmax, einsum; precision=HIGHEST", 1e-3),),
          flops="attention"),
    Bench("RMSNORM", {"RN_ROWS": 4096, "RN_HIDDEN": 4096}, "RMSNorm, __half2 (rmsnorm_half2.cu)", "4096x4096 fp16",
          (("rmsnorm", "jnp rmsnorm in fp32, cast to fp16", 1e-2),)),
    Bench("FP8_QUANT", {"FQ_ROWS": 4096, "FQ_COLS": 4096}, "FP8 E4M3 per-row quantization (fp8_quant_per_row.cu)",
          "4096x4096 bf16", (("fp8_quant", "jnp amax, scale, clip, astype(float8_e4m3fn)", 0.1),)),  # one E4M3 step
    Bench("TRANSPOSE", {"TR_ROWS": 4096, "TR_COLS": 4096}, "tiled transpose (transpose_tiled.cu)", "4096x4096 fp32",
          (("transpose", "jnp.transpose", 0.0),)),
)


def _gemm_flops(a, b, *rest):
  return 2 * a.shape[0] * a.shape[1] * b.shape[1]


def _attention_flops(q, k, v):
  batch, heads, t, d = q.shape
  return 4 * batch * heads * d * t * (t + 1) // 2  # QK^T and PV over the unmasked (causal) pairs


FLOPS = {"gemm": _gemm_flops, "attention": _attention_flops}


# ------------------------------------------------------------------ the XLA side

def _xla_functions(trk) -> dict:
  """Row key -> the XLA equivalent, a function of the case's inputs."""
  import jax
  import jax.numpy as jnp
  from jax import lax
  highest = lax.Precision.HIGHEST

  def layernorm(x, weight, bias):
    mean = x.mean(axis=1)
    centered = x - mean[:, None]
    rstd = lax.rsqrt((centered * centered).mean(axis=1) + 1e-5)  # the kernel's two-pass variance and eps
    return centered * rstd[:, None] * weight + bias, mean, rstd

  def attention(q, k, v):
    t = q.shape[2]
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, precision=highest) * trk.AT_SCALE
    scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(scores, axis=-1), v, precision=highest)

  def rmsnorm(x, weight):
    xf = x.astype(jnp.float32)  # the kernel's sum of squares is in fp32 too
    inv_rms = lax.rsqrt((xf * xf).mean(axis=1, keepdims=True) + trk.RN_EPS)
    return (xf * inv_rms * weight.astype(jnp.float32)).astype(x.dtype)

  def fp8_quant(x):
    x = x.astype(jnp.float32)
    scale = jnp.maximum(jnp.abs(x).max(axis=1) / trk.FP8_MAX, 1.0 / (trk.FP8_MAX * 512))
    # clip: a cast past E4M3's largest value gives NaN in XLA, where the kernel's saturates
    q = jnp.clip(x * (1.0 / scale)[:, None], -trk.FP8_MAX, trk.FP8_MAX).astype(jnp.float8_e4m3fn)
    return q, scale

  return {
      "gelu": lambda x: jax.nn.gelu(x, approximate=True),
      "layernorm": layernorm,
      "softmax": lambda x: jax.nn.softmax(x, axis=-1),
      "sgemm": lambda a, b: trk.SG_ALPHA * jnp.matmul(a, b, precision=highest),
      "sgemm_tf32": lambda a, b: trk.SG_ALPHA * jnp.matmul(a, b),
      "wmma": lambda a, b, bias: jnp.matmul(a, b, preferred_element_type=jnp.float32) + bias,
      "attention": attention,
      "rmsnorm": rmsnorm,
      "fp8_quant": fp8_quant,
      "transpose": jnp.transpose,
  }


# ------------------------------------------------------------------ building the programs

def import_corpus():
  """kernels/cuda_corpus.py, the corpus cases (it imports jax: only the child imports it)."""
  from benchmarks.kernels import cuda_corpus
  return cuda_corpus


@contextlib.contextmanager
def _sized(module, sizes: dict):
  """The module's size constants set to `sizes` for the duration."""
  missing = [name for name in sizes if not hasattr(module, name)]
  if missing:  # else the recipe would run at the tests' size and the table would not say so
    raise AttributeError(f"{module.__name__} has no {', '.join(missing)}: the corpus cases changed")
  saved = {name: getattr(module, name) for name in sizes}
  for name, value in sizes.items():
    setattr(module, name, value)
  try:
    yield
  finally:
    for name, value in saved.items():
      setattr(module, name, value)


def _tuple(outs) -> tuple:
  return tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)


def chained(fn, n: int):
  """A function of fn's inputs making n calls of fn (see the module's docstring); all their outputs."""
  from jax import lax

  def program(*args):
    every = []
    for _ in range(n):
      if every:
        args, _ = lax.optimization_barrier((args, every[-1]))
      every.append(_tuple(fn(*args)))
    return every
  return program


def build(trk, bench: Bench, rng, *, targets=None):
  """(our function, {row key: XLA function}, inputs as numpy arrays) at the benchmark's size."""
  import jax
  case = getattr(trk, bench.case)
  kernel = trk.compile_case(case, **({"targets": targets} if targets else {}))
  with _sized(trk, bench.sizes):
    ours = case.call(kernel)
    inputs = case.inputs(rng)
  functions = _xla_functions(trk)
  xla = {key: functions[key] for key, _, _ in bench.xla}
  # Both sides must produce the same shapes and dtypes: this also catches a recipe
  # that did not take the benchmark's size.
  avals = [jax.ShapeDtypeStruct(x.shape, x.dtype) for x in inputs]
  want = [(o.shape, o.dtype) for o in _tuple(jax.eval_shape(ours, *avals))]
  for key, fn in xla.items():
    got = [(o.shape, o.dtype) for o in _tuple(jax.eval_shape(fn, *avals))]
    if got != want:
      raise ValueError(f"{key}: XLA gives {got}, ours {want}")
  return ours, xla, inputs


def max_relative_difference(ours, xla) -> float | None:
  """max |ours - XLA| / max |XLA| over the outputs (each scaled by its own largest
  value); None when anything is not finite."""
  import numpy as np
  worst = 0.0
  for a, b in zip(ours, xla, strict=True):
    a, b = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    if a.shape != b.shape or not (np.isfinite(a).all() and np.isfinite(b).all()):
      return None
    worst = max(worst, float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30)))
  return worst


# ------------------------------------------------------------------ measuring (in the child)

def run(rounds: int = ROUNDS, chain: int = CHAIN) -> dict:
  import jax
  import numpy as np
  trk = import_corpus()
  result = {"chain": chain, "rounds": rounds, "rows": {}, "errors": {}}
  rng = np.random.default_rng(0)
  for bench in BENCHES:
    keys = [key for key, _, _ in bench.xla]
    try:
      ours, xla, inputs = build(trk, bench, rng)
      args = [jax.device_put(x) for x in inputs]
      programs = {"ours": jax.jit(chained(ours, chain))}
      programs.update({key: jax.jit(chained(fn, chain)) for key, fn in xla.items()})
      first = {}
      for name, program in programs.items():  # compiles each, outside the timing
        first[name] = [np.asarray(o) for o in program(*args)[0]]
      seconds = timing.interleaved({name: lambda p=p, a=args: jax.block_until_ready(p(*a))
                                    for name, p in programs.items()}, rounds)
    except Exception:  # this kernel's rows say why; the others still count
      result["errors"].update({key: traceback.format_exc()[-1500:] for key in keys})
      continue
    moved = sum(x.nbytes for x in inputs) + sum(o.nbytes for o in first["ours"])
    work = {"flops": FLOPS[bench.flops](*inputs)} if bench.flops else {"bytes": moved}
    for key, _, tolerance in bench.xla:
      difference = max_relative_difference(first["ours"], first[key])
      result["rows"][key] = {"ours_us": seconds["ours"] / chain * 1e6, "xla_us": seconds[key] / chain * 1e6,
                             "max_rel_diff": difference, "tolerance": tolerance,
                             "agree": difference is not None and difference <= tolerance, **work}
    del programs, args, first
  return result


# ------------------------------------------------------------------ the report (no jax)

def _rates(row: dict) -> str:
  """Ours / XLA's, in TFLOP/s or TB/s."""
  if "flops" in row:
    return f"{row['flops'] / row['ours_us'] / 1e6:.1f} / {row['flops'] / row['xla_us'] / 1e6:.1f} TFLOP/s"
  return f"{row['bytes'] / row['ours_us'] / 1e6:.2f} / {row['bytes'] / row['xla_us'] / 1e6:.2f} TB/s"


def _agreement(row: dict) -> str:
  if row.get("max_rel_diff") is None:
    return "**no** (not finite)"
  verdict = "yes" if row["agree"] else "**no**"
  return f"{verdict} ({sig(row['max_rel_diff'])}{'' if row['agree'] else ' > ' + sig(row['tolerance'])})"


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  rows, notes = [], []
  for bench in BENCHES:
    for index, (key, what, _) in enumerate(bench.xla):
      kernel = (bench.label, bench.size) if index == 0 else ("same kernel", "")
      row = r["rows"].get(key)
      if row is None:
        rows.append([*kernel, what, "n/a", "n/a", "n/a", "n/a", "n/a"])
        if key in r.get("errors", {}):
          notes.append(f"- {key}: n/a: {last_line(r['errors'][key])}")
        continue
      rows.append([*kernel, what, fmt(row["ours_us"], 1), fmt(row["xla_us"], 1),
                   fmt(ratio(row["ours_us"], row["xla_us"])),
                   _rates(row), _agreement(row)])
  method = (f"Each kernel of the CUDA corpus (benchmarks/kernels/corpus) runs as its case launches it (its "
            f"recipe and input maker, at the size shown), inside jax.jit, against the same operation in "
            f"jax.numpy. Each side is a chain of {r['chain']} calls on the same inputs with an optimization "
            f"barrier between calls (no CSE, no fusion across calls); per-call time is the host-timed median of "
            f"{r['rounds']} chains over {r['chain']}, both sides interleaved. ours / XLA above 1: ours is slower. "
            "Rate: TFLOP/s for GEMMs and attention (causal: unmasked pairs only), else the least traffic (inputs "
            "read once, outputs written once) per second. Agree: max |ours - XLA| / max |XLA| over the outputs, "
            "checked once against a loose tolerance.")
  header = ["kernel", "size", "XLA equivalent", "ours (us/call)", "XLA (us/call)", "ours / XLA",
            "rate, ours / XLA", "agree"]
  text = method + "\n\n" + table(header, rows, "lllrrrrl")
  return [text + ("\n\n" + "\n".join(notes) if notes else "")]
