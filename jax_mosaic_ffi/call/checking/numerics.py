"""How a kernel's output is compared with its reference: the tolerance of each dtype, the comparison itself (a few
numbers that say whether and where they differ, computed on the device, inside a program or out of one), and the
distance of two values in ULPs.

One element passes when ``|got - want| <= atol + rtol * |want|``, that element's own ``want``: numpy's ``allclose``,
never scaled by the rest of the array (a tolerance relative to the array's largest element would let one huge
element hide every other element's error). A kernel that accumulates (a GEMM, attention, a reduction) rounds
differently from its reference by about its sum's error, which an element that cancels to nearly zero does not
scale down: such a check states its own ``atol``, from the size of its sums. Non-finite values are compared by
position: NaN matches only NaN, +inf only +inf, -inf only -inf; a complex value's real and imaginary parts each so
(its finite parts then compared as one complex difference). Integers and bools are compared exactly, whatever
tolerance is asked for. The tolerances per dtype (`tolerance`) allow for what a kernel legitimately does
differently from a jax.numpy reference in an elementwise computation: fused multiply-adds, a wider intermediate,
another rounding of the last step.

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
import math

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
  of this module's docstring; ``(0, 0)`` for integers and bools, which are compared exactly whatever is asked."""
  dtype = jnp.dtype(dtype)
  if exact(dtype):
    return 0.0, 0.0
  for key, value in (overrides or {}).items():
    if jnp.dtype(key) == dtype:
      rtol, atol = value
      return float(rtol), float(atol)
  if dtype.name in _TOLERANCES:
    t = _TOLERANCES[dtype.name]
  else:  # the 8-bit and narrower floats: one ULP at 1
    t = float(ml_dtypes.finfo(dtype).eps)
  return t, t


def lookup(who: str, tolerances=None, rtol: float | None = None, atol: float | None = None):
  """``dtype -> (rtol, atol)``: `tolerance` with ``tolerances`` (``{dtype: (rtol, atol)}``) first, then ``rtol`` /
  ``atol`` in place of the table's for every floating-point dtype; ``who`` (``"jmf.check"``) names the caller in
  the error for a tolerance given for integers or bools, which are compared exactly."""
  for key in tolerances or {}:
    if exact(key):
      name = jnp.dtype(key).name
      raise ValueError(f"{who}: tolerances= names {name}, but integer and bool outputs are compared exactly; "
                       f"leave {name} out of it")

  def of(dtype) -> tuple[float, float]:
    default = tolerance(dtype, tolerances)
    if exact(dtype):
      return default
    return (default[0] if rtol is None else float(rtol)), (default[1] if atol is None else float(atol))
  return of


def _compute_dtype(dtype):
  if jnp.issubdtype(dtype, jnp.complexfloating):
    return jnp.complex128 if dtype == jnp.complex128 else jnp.complex64
  return jnp.float64 if dtype == jnp.float64 else jnp.float32


def _components(x) -> list:
  return [jnp.real(x), jnp.imag(x)] if jnp.issubdtype(x.dtype, jnp.complexfloating) else [x]


def _inexact_excess(g, w, rtol: float, atol: float):
  """Per element: 0 where equal, the error over the element's own tolerance where finite (above 1: a mismatch),
  inf where a non-finite component is not the same non-finite value at the same position."""
  wide = _compute_dtype(g.dtype)
  gs, ws = _components(g.astype(wide)), _components(w.astype(wide))
  # A component that is NaN or an infinity on either side must be the same on both: +inf only +inf, NaN only NaN.
  special_ok = jnp.ones(g.shape, bool)
  errors, magnitudes = [], []
  for gc, wc in zip(gs, ws):
    finite = jnp.isfinite(gc) & jnp.isfinite(wc)
    special_ok &= finite | (gc == wc) | (jnp.isnan(gc) & jnp.isnan(wc))
    errors.append(jnp.where(finite, gc - wc, 0.0))
    magnitudes.append(jnp.where(finite, wc, 0.0))
  if len(errors) == 1:
    error, magnitude = jnp.abs(errors[0]), jnp.abs(magnitudes[0])
  else:  # the finite parts as one complex number: a complex product's error scales with its modulus
    error, magnitude = jnp.hypot(*errors), jnp.hypot(*magnitudes)
  bound = atol + rtol * magnitude
  # error 0 passes whatever the bound (0 included); a positive error over a zero bound is inf.
  excess = jnp.where(error == 0, 0.0, error / jnp.where(bound > 0, bound, 0.0))
  excess = jnp.where(special_ok & ~jnp.isnan(excess), excess, jnp.inf)
  return excess.astype(jnp.float32)


def summarize(got, want, rtol: float, atol: float) -> tuple:
  """A jax function of two arrays of one shape and dtype: ``(mismatches, worst, got[worst], want[worst],
  excess[worst])``, where ``worst`` is the flat index of the element furthest outside the tolerance (or closest to
  it) and ``excess`` is its error over its own tolerance, ``atol + rtol * |want|`` (above 1: a mismatch; inf: a
  NaN or an infinity the other side has not at that position, or an integer that differs). Small enough to hand to
  a host callback; runs inside a program or out of one."""
  g, w = jnp.ravel(got), jnp.ravel(want)
  if g.size == 0:
    zero = jnp.zeros((), jnp.float32)
    return jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), g.dtype), jnp.zeros((), w.dtype), zero
  if exact(g.dtype):
    differ = g != w
    # Differences as floats only to find the largest; whether they differ is exact (an off-by-one of 2^40 too).
    excess = jnp.where(differ, jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)) + 2.0, 0.0)
  else:
    excess = _inexact_excess(g, w, rtol, atol)
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
  """The worst element of a `summarize` result, with its errors computed on the host in the output's dtype (a
  NaN or an infinity the other side has not at that position: an infinite error)."""
  dtype = np.dtype(dtype)
  index = tuple(int(i) for i in np.unravel_index(int(flat_index), shape)) if shape else ()
  g, w = np.asarray(got, dtype), np.asarray(want, dtype)
  if dtype == np.bool_:
    gv, wv = bool(g), bool(w)
    diff, size = float(gv != wv), float(wv)
  elif exact(dtype):
    gv, wv = int(g), int(w)
    diff, size = float(abs(gv - wv)), float(abs(wv))
  else:
    wide = np.complex128 if np.issubdtype(dtype, np.complexfloating) else np.float64
    gv, wv = g.astype(wide).item(), w.astype(wide).item()
    parts = [(complex(gv).real, complex(wv).real), (complex(gv).imag, complex(wv).imag)]
    finite = [math.isfinite(a) and math.isfinite(b) for a, b in parts]
    matched = all(f or a == b or (math.isnan(a) and math.isnan(b)) for f, (a, b) in zip(finite, parts))
    diff = math.hypot(*(a - b for f, (a, b) in zip(finite, parts) if f)) if matched else math.inf
    size = math.hypot(*(b for f, (_, b) in zip(finite, parts) if f))
  rel = diff / size if size else (0.0 if diff == 0 else math.inf)
  return Worst(index, gv, wv, diff, float(rel), ulps(g, w, dtype))


def device_summary(got, want, rtol: float, atol: float) -> list:
  """`summarize` run as its own program, its results on the host (numpy)."""
  return [np.asarray(v) for v in jax.jit(summarize, static_argnums=(2, 3))(got, want, rtol, atol)]
