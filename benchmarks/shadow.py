"""The cost of the shadow mode (jmf.verify, JAX_MOSAIC_FFI_VERIFY): a kernel checked against its fallback inside the
program, against the same program without the check.

The corpus's CUDA tiled matmul (kernels/tiled_matmul.py, fp32, its fallback jnp.matmul at full precision) at two
sizes, in one process. First call: a fresh jitted function (traced, lowered, compiled by XLA, run once) plain,
with ``verify("first")`` and with ``verify("always")``, the kernel itself compiled beforehand (NVRTC's cache is
not what is measured); the variants take turns round by round. Later calls: per call of each executable after its
first call, host-timed with the variants interleaved: the plain one, the ``first`` one (lowered before its check:
the gate, a host callback and a conditional, then nothing), and the ``always`` one (the fallback, the comparison and
a host callback on every call). A program lowered after its specialization was checked is the plain one (tests
check that its HLO is identical), so it is not timed apart.
"""

from __future__ import annotations

import statistics
import time

from benchmarks import timing
from benchmarks.markdown import failure, fmt, table
from benchmarks.suite import Run

NAME = "shadow"
TITLE = "Shadow mode: the cost of checking a kernel inside the program"
ORDER = 47
RUNS = (Run("main", timeout_s=300.0),)

SIZES = (256, 1024)        # M = N = K
META = dict(BM=64, BN=64, BK=16, TM=4, TN=4)
FIRST_CALL_ROUNDS = 7
ROUNDS = 30
VARIANTS = {"plain": "plain", "first": 'verify("first")', "always": 'verify("always")'}


def _setting(jmf, variant: str):
  import contextlib
  # Each element is held to atol + rtol * |its own value|: a float32 sum of K = 1024 products rounds by up to about
  # 7e-5 near zero in another order (a sequential FMA loop against BLAS, simulated), hence atol 1e-3.
  return contextlib.nullcontext() if variant == "plain" else jmf.verify(variant, on_mismatch="raise", atol=1e-3)


def run(first_call_rounds: int = FIRST_CALL_ROUNDS, rounds: int = ROUNDS) -> dict:
  import jax
  import numpy as np

  import jax_mosaic_ffi as jmf
  from benchmarks.kernels import tiled_matmul

  matmul = tiled_matmul.call(META)
  step = lambda a, b: matmul(a, b) + 1.0  # noqa: E731  (one call site for every program)
  results = {}
  for n in SIZES:
    a, b = (jax.random.normal(jax.random.key(k), (n, n), np.float32) for k in (1, 2))
    expected = np.asarray(tiled_matmul.reference(a, b)) + 1.0
    jax.jit(step)(a, b).block_until_ready()  # the kernel compiled (NVRTC) before the first-call rounds
    first_ms = {v: [] for v in VARIANTS}
    for r in range(first_call_rounds):
      order = list(VARIANTS)[r % 3:] + list(VARIANTS)[:r % 3]
      for variant in order:
        with _setting(jmf, variant):  # a new setting: its specialization not yet checked
          start = time.perf_counter()
          out = jax.jit(lambda a, b: step(a, b))(a, b).block_until_ready()
          first_ms[variant].append((time.perf_counter() - start) * 1e3)
        np.testing.assert_allclose(np.asarray(out), expected, rtol=1e-4, atol=1e-3)
    executables = {}
    for variant in VARIANTS:
      with _setting(jmf, variant) as seen:
        executables[variant] = jax.jit(lambda a, b: step(a, b))
        executables[variant](a, b).block_until_ready()  # lowered and (for first) checked
      if seen is not None and jax.default_backend() == "gpu":  # (elsewhere the fallback runs: nothing to check)
        assert seen.report.passed and len(seen.report.rows) == 1, seen.report
    us = timing.interleaved({v: (lambda f=f: f(a, b).block_until_ready()) for v, f in executables.items()}, rounds)
    results[str(n)] = {"first_call_ms": {v: statistics.median(t) for v, t in first_ms.items()},
                       "us_per_call": {v: s * 1e6 for v, s in us.items()}}
  return {"first_call_rounds": first_call_rounds, "rounds": rounds, "sizes": results}


def tables(results: dict) -> list[str]:
  r = results.get("main")
  why = failure(r)
  if why:
    return [f"n/a: {why}"]
  rows = []
  for n, sizes in r["sizes"].items():
    first, later = sizes["first_call_ms"], sizes["us_per_call"]
    for variant, label in VARIANTS.items():
      rows.append([f"{n}^3 fp32", label, fmt(first[variant], 1), fmt(first[variant] / first["plain"]),
                   fmt(later[variant], 1), fmt(later[variant] / later["plain"])])
  header = ["tiled matmul", "setting", "first call (ms)", "x plain", "later calls (us)", "x plain"]
  tiles = ", ".join(f"{k}={v}" for k, v in META.items())
  method = (f"`benchmarks/kernels/tiled_matmul.py` ({tiles}) in `jnp.matmul(a, b) + 1`'s place; its fallback "
            "`jnp.matmul` at full precision. First call: a fresh `jax.jit` traced, lowered, compiled and run once, "
            f"median of {r['first_call_rounds']} rounds in which the settings take turns (the kernel compiled "
            f"before). Later calls: host time per call, median of {r['rounds']} interleaved rounds; `first`'s "
            "executable was lowered before its check (the gate stays), a program lowered after it is the plain one.")
  return [method + "\n\n" + table(header, rows, "llrrrr")]
