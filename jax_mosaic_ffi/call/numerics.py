"""How a kernel's output is compared with its reference: the tolerance of each dtype, the comparison itself (a few
numbers that say whether and where they differ, computed on the device, inside a program or out of one), and the
distance of two values in ULPs.

One element passes when ``|got - want| <= atol * scale + rtol * |want|``, where ``scale`` is the largest ``|want|``
of the array (1 when it is all zeros): numpy's ``allclose`` with ``atol`` relative to the array's magnitude, so that
an element that cancels to nearly zero in a long sum (a matmul's) is held to the error of the sum, not to its own
size. NaN matches NaN and an infinity the same infinity. The tolerances per dtype (`tolerance`) allow for what a
kernel legitimately does differently from a jax.numpy reference: another summation order, fused multiply-adds, a
wider accumulator.

=========================================  ==========  ==========
dtype                                      rtol        atol
=========================================  ==========  ==========
float64, complex128                        1e-9        1e-9
float32, complex64                         1e-5        1e-5
float16                                    2e-3        2e-3        (2 ULPs at 1)
bfloat16                                   1.6e-2      1.6e-2      (2 ULPs at 1)
float8 (e4m3, e5m2, ...) and narrower      1 ULP at 1  1 ULP at 1  (0.125 for e4m3fn, 0.25 for e5m2)
integers, bool                             0           0           (exact)
=========================================  ==========  ==========
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

_TOLERANCES = {"float64": 1e-9, "complex128": 1e-9, "float32": 1e-5, "complex64": 1e-5, "float16": 2e-3,
               "bfloat16": 1.6e-2}


def exact(dtype) -> bool:
  """Integers and bools are compared exactly."""
  return not jnp.issubdtype(dtype, jnp.inexact)


def tolerance(dtype, overrides=None) -> tuple[float, float]:
  """``(rtol, atol)`` for outputs of ``dtype``: ``overrides`` (a mapping of dtypes to pairs) first, then the table
  of this module's docstring."""
  dtype = jnp.dtype(dtype)
  for key, value in (overrides or {}).items():
    if jnp.dtype(key) == dtype:
      rtol, atol = value
      return float(rtol), float(atol)
  if exact(dtype):
    return 0.0, 0.0
  if dtype.name in _TOLERANCES:
    t = _TOLERANCES[dtype.name]
  else:  # the 8-bit and narrower floats: one ULP at 1
    t = float(ml_dtypes.finfo(dtype).eps)
  return t, t


def _compute_dtype(dtype):
  if jnp.issubdtype(dtype, jnp.complexfloating):
    return jnp.complex128 if dtype == jnp.complex128 else jnp.complex64
  return jnp.float64 if dtype == jnp.float64 else jnp.float32


def summarize(got, want, rtol: float, atol: float) -> tuple:
  """A jax function of two arrays of one shape and dtype: ``(mismatches, worst, got[worst], want[worst],
  excess[worst])``, where ``worst`` is the flat index of the element furthest outside the tolerance (or closest to
  it) and ``excess`` is its error over the tolerance (above 1: a mismatch; inf: one is NaN or an infinity the other
  is not). Small enough to hand to a host callback; runs inside a program or out of one."""
  g, w = jnp.ravel(got), jnp.ravel(want)
  if g.size == 0:
    zero = jnp.zeros((), jnp.float32)
    return jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), g.dtype), jnp.zeros((), w.dtype), zero
  if exact(g.dtype):
    wide = jnp.float32
    differ = g != w
    # Differences as floats only to find the largest; whether they differ is exact.
    excess = jnp.where(differ, jnp.abs(g.astype(wide) - w.astype(wide)) + 2.0, 0.0)
  else:
    wide = _compute_dtype(g.dtype)
    gf, wf = g.astype(wide), w.astype(wide)
    error = jnp.abs(gf - wf)
    magnitude = jnp.abs(wf)
    scale = jnp.max(jnp.where(jnp.isfinite(magnitude), magnitude, 0.0))
    bound = atol * jnp.where(scale > 0, scale, 1.0) + rtol * magnitude
    same = (gf == wf) | (jnp.isnan(gf) & jnp.isnan(wf))
    excess = jnp.where(same, 0.0, jnp.where(jnp.isfinite(error), error / bound, jnp.inf))
    excess = jnp.where(jnp.isnan(excess), jnp.inf, excess).astype(jnp.float32)
  worst = jnp.argmax(excess)
  mismatches = jnp.sum(excess > 1.0, dtype=jnp.int32)
  return mismatches, worst.astype(jnp.int32), g[worst], w[worst], excess[worst].astype(jnp.float32)


def ulps(got, want, dtype) -> int | None:
  """How many representable values of ``dtype`` lie between ``got`` and ``want`` (0: equal); None for NaN, integers,
  complex numbers and types narrower than a byte."""
  dtype = np.dtype(dtype)
  if exact(dtype) or jnp.issubdtype(dtype, jnp.complexfloating):
    return None
  bits = 8 * dtype.itemsize
  if ml_dtypes.finfo(dtype).bits != bits:
    return None
  a, b = np.asarray(got, dtype), np.asarray(want, dtype)
  if np.isnan(a.astype(np.float64)) or np.isnan(b.astype(np.float64)):
    return None
  unsigned = np.dtype(f"uint{bits}")

  def ordered(x) -> int:  # sign and magnitude -> one integer line, -0 and +0 together
    raw = int(x.view(unsigned))
    sign = 1 << (bits - 1)
    return -(raw & (sign - 1)) if raw & sign else raw

  return abs(ordered(a) - ordered(b))


@dataclasses.dataclass(frozen=True)
class Worst:
  """The element furthest outside the tolerance, as a report shows it."""

  index: tuple[int, ...]
  got: complex | float | int | bool
  want: complex | float | int | bool
  abs_error: float
  rel_error: float
  ulps: int | None


def worst_element(shape, dtype, flat_index, got, want) -> Worst:
  """The worst element of a `summarize` result, with its errors computed on the host in the output's dtype."""
  dtype = np.dtype(dtype)
  index = tuple(int(i) for i in np.unravel_index(int(flat_index), shape)) if shape else ()
  g, w = np.asarray(got, dtype), np.asarray(want, dtype)
  if dtype == np.bool_:
    gv, wv = bool(g), bool(w)
    diff = float(gv != wv)
  elif exact(dtype):
    gv, wv = int(g), int(w)
    diff = float(abs(gv - wv))
  else:
    wide = np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64
    gv, wv = g.astype(wide).item(), w.astype(wide).item()
    diff = float(abs(gv - wv)) if np.isfinite(gv) and np.isfinite(wv) else (0.0 if gv == wv else float("inf"))
    if np.isnan(gv) and np.isnan(wv):
      diff = 0.0
  rel = diff / abs(wv) if wv else (0.0 if diff == 0 else float("inf"))
  return Worst(index, gv, wv, diff, float(rel), ulps(g, w, dtype))


def device_summary(got, want, rtol: float, atol: float) -> list:
  """`summarize` run as its own program, its results on the host (numpy)."""
  return [np.asarray(v) for v in jax.jit(summarize, static_argnums=(2, 3))(got, want, rtol, atol)]
