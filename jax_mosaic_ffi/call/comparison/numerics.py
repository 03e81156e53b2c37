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
tolerance is asked for. The comparison also counts the elements that passed only by ``atol`` (``|got - want| >
rtol * |want|``): a check whose output passes mostly so is held by its absolute floor alone.

The tolerances per dtype (`tolerance`) allow for what a kernel legitimately does differently from a jax.numpy
reference in an elementwise computation: fused multiply-adds, a wider intermediate, another rounding of the last
step. ``rtol`` is two roundings of the output's type (2 ULPs at 1: a kernel that computes in float32 and rounds
once differs from a reference that does the same by at most one ULP of the result, and by one more where it
rounds an intermediate too); float32's is looser, 1e-5 (84 ULPs), for the approximate ``exp``, ``rsqrt`` and
division that CUDA's fast intrinsics and Triton use. ``atol`` is an absolute floor for values near zero, small
for every type: 1e-5, torch.testing's ``assert_close`` floor, which covers a float32 intermediate's rounding of
terms up to about 100 where they cancel, and, in the types narrower than 16 bits, one step at zero (their
smallest subnormal), which two roundings of nearly equal values can differ by. It used to equal ``rtol`` for
float16 and bfloat16 (2e-3, 1.6e-2): any output whose elements are all smaller than that, a softmax over 4096
columns or its gradient, then passed as all zeros. A kernel whose half-precision intermediates cancel, or that
accumulates, states its ``atol``.

=========================================  ==========  ================================================
dtype                                      rtol        atol
=========================================  ==========  ================================================
float64, complex128                        1e-9        1e-9
float32, complex64                         1e-5        1e-5
float16                                    2e-3        1e-5        (rtol: 2 ULPs at 1)
bfloat16                                   1.6e-2      1e-5        (rtol: 2 ULPs at 1)
float8 (e4m3, e5m2, ...) and narrower      1 ULP at 1  one step at zero (2^-9 for e4m3fn, 2^-16 for e5m2)
integers, bool                             0           0           (exact)
=========================================  ==========  ================================================
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

_TOLERANCES = {"float64": (1e-9, 1e-9), "complex128": (1e-9, 1e-9), "float32": (1e-5, 1e-5),
               "complex64": (1e-5, 1e-5), "float16": (2e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5)}


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
    return _TOLERANCES[dtype.name]
  # The 8-bit and narrower floats: one ULP at 1, and one step at zero (a float32 value just under half of it and
  # one just over round to 0 and to that step).
  finfo = ml_dtypes.finfo(dtype)
  return float(finfo.eps), float(finfo.smallest_subnormal)


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
  inf where a non-finite component is not the same non-finite value at the same position; and where an element
  passed only by ``atol`` (its error over ``rtol * |want|``, within ``atol`` more)."""
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
  relative_bound = rtol * magnitude
  bound = atol + relative_bound
  # error 0 passes whatever the bound (0 included); a positive error over a zero bound is inf.
  excess = jnp.where(error == 0, 0.0, error / jnp.where(bound > 0, bound, 0.0))
  excess = jnp.where(special_ok & ~jnp.isnan(excess), excess, jnp.inf)
  by_atol = (excess <= 1.0) & (error > relative_bound)
  return excess.astype(jnp.float32), by_atol


# How many numbers `summarize` gives per array: what a host callback hands over for each output.
SUMMARY_SIZE = 6


def summarize(got, want, rtol: float, atol: float) -> tuple:
  """A jax function of two arrays of one shape and dtype: ``(mismatches, worst, got[worst], want[worst],
  excess[worst], passed_by_atol)``, where ``worst`` is the flat index of the element furthest outside the
  tolerance (or closest to it), ``excess`` is its error over its own tolerance, ``atol + rtol * |want|`` (above 1:
  a mismatch; inf: a NaN or an infinity the other side has not at that position, or an integer that differs), and
  ``passed_by_atol`` counts the elements within the tolerance but not within ``rtol * |want|`` alone. Small enough
  to hand to a host callback (`SUMMARY_SIZE` numbers); runs inside a program or out of one."""
  g, w = jnp.ravel(got), jnp.ravel(want)
  none = jnp.zeros((), jnp.int32)
  if g.size == 0:
    zero = jnp.zeros((), jnp.float32)
    return none, none, jnp.zeros((), g.dtype), jnp.zeros((), w.dtype), zero, none
  if exact(g.dtype):
    differ = g != w
    # Differences as floats only to find the largest; whether they differ is exact (an off-by-one of 2^40 too).
    excess = jnp.where(differ, jnp.abs(g.astype(jnp.float32) - w.astype(jnp.float32)) + 2.0, 0.0)
    passed_by_atol = none
  else:
    excess, by_atol = _inexact_excess(g, w, rtol, atol)
    passed_by_atol = jnp.sum(by_atol, dtype=jnp.int32)
  worst = jnp.argmax(excess)
  mismatches = jnp.sum(excess > 1.0, dtype=jnp.int32)
  return (mismatches, worst.astype(jnp.int32), g[worst], w[worst], excess[worst].astype(jnp.float32),
          passed_by_atol)


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
