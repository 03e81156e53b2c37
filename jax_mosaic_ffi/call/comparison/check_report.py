"""What a check found: one `Comparison` per array compared, and the `CheckReport` of them all, printable as a table.

`jmf.check` and the shadow mode (`jmf.verify`, ``JAX_MOSAIC_FFI_VERIFY``) both make these, from the numbers
`numerics.summarize` computes on the device.
"""

from __future__ import annotations

import dataclasses
import re
import textwrap
from typing import Sequence

import numpy as np

from jax_mosaic_ffi.call.comparison import numerics


@dataclasses.dataclass(frozen=True)
class Comparison:
  """One array compared with its reference (a row of a `CheckReport`).

  Attributes:
    what: the comparison: ``"outputs"`` (the function against its reference), ``"jit vs eager"``, ``"vmap vs
      loop"``, ``"VJP"``, ``"JVP"``, ``"kernel vs fallback"`` (one kernel call against its own fallback, on the
      inputs it got in the program) or ``"derivative rule"`` (one `differentiable`'s rule against autodiff of its
      fallbacks), with the program it ran in for a kernel's.
    case: the inputs, as ``"float32[1000], int32[8]"``.
    output: which array: ``"out0"`` (an output), ``"d in1"`` (a cotangent or tangent of input 1)...
    kernel: the kernel call (or derivative rule) this row is about, with its call site, when it is one.
    dtype, shape: the array's.
    rtol, atol: the tolerance it was held to.
    mismatches, size: how many of its elements were outside the tolerance, of how many.
    worst: the element furthest outside the tolerance (or closest to it): its index, both values, absolute and
      relative error and distance in ULPs.
    skipped: why it was not compared (a shape the kernel refuses, a derivative it does not define), or None.
    passed_by_atol: how many elements passed only by ``atol``: ``|got - want| > rtol * |want|``, but within
      ``atol + rtol * |want|``. Many of them say the check holds by its absolute floor alone.
    reference_dtype: the reference's dtype where it is not ``dtype``, or None. Such a row fails without comparing
      values (an int8 output that wraps where its int32 reference does not, a float16 output of a float32
      function); `check`'s ``cast_reference=True`` casts the reference to ``dtype`` instead.
  """

  what: str
  case: str
  output: str
  kernel: str | None
  dtype: str
  shape: tuple[int, ...]
  rtol: float
  atol: float
  mismatches: int = 0
  size: int = 0
  worst: numerics.Worst | None = None
  skipped: str | None = None
  passed_by_atol: int = 0
  reference_dtype: str | None = None

  @property
  def failed(self) -> bool:
    return self.skipped is None and (self.mismatches > 0 or self.reference_dtype is not None)

  def describe(self) -> str:
    """One sentence: what was compared and, for a mismatch, where and by how much."""
    head = f"{self.what}, {self.output} ({self.dtype}{list(self.shape)}) for inputs ({self.case})"
    if self.kernel:
      head += f", {self.kernel}"
    if self.skipped is not None:
      return f"{head}: not compared: {self.skipped}"
    if self.reference_dtype is not None:
      return (f"{head}: returns {self.dtype} where its reference returns {self.reference_dtype}; return "
              f"{self.reference_dtype}, or pass cast_reference=True to compare with the reference cast to {self.dtype}")
    by_atol = f"; {self.passed_by_atol} passed only by atol" if self.passed_by_atol else ""
    if not self.failed:
      return f"{head}: matches{by_atol}"
    w = self.worst
    detail = (f"worst at {list(w.index)}: got {_value(w.got)}, want {_value(w.want)} (abs error {_value(w.abs_error)}, "
              f"rel error {_value(w.rel_error)}" + (f", {w.ulps} ULPs" if w.ulps is not None else "") + ")")
    return (f"{head}: {self.mismatches} of {self.size} elements differ beyond rtol={self.rtol:g}, "
            f"atol={self.atol:g}; {detail}{by_atol}")


def compared(what: str, case: str, output: str, kernel: str | None, shape, dtype, rtol: float, atol: float,
             summary: Sequence) -> Comparison:
  """The row of one `numerics.summarize` result (numpy values on the host)."""
  mismatches, worst, got, want, _, passed_by_atol = summary
  size = int(np.prod(shape)) if shape else 1
  found = numerics.worst_element(tuple(shape), dtype, int(worst), got, want) if size else None
  return Comparison(what, case, output, kernel, np.dtype(dtype).name, tuple(int(d) for d in shape), rtol, atol,
                    int(mismatches), size, found, passed_by_atol=int(passed_by_atol))


def skipped(what: str, case: str, output: str, kernel: str | None, why: str, shape=(), dtype="float32") -> Comparison:
  return Comparison(what, case, output, kernel, np.dtype(dtype).name, tuple(shape), 0.0, 0.0, skipped=why)


def differing_dtype(what: str, case: str, output: str, kernel: str | None, shape, dtype,
                    reference_dtype) -> Comparison:
  """The row of an output whose dtype is not its reference's: failed, its values not compared."""
  size = int(np.prod(shape)) if shape else 1
  return Comparison(what, case, output, kernel, np.dtype(dtype).name, tuple(int(d) for d in shape), 0.0, 0.0,
                    size=size, reference_dtype=np.dtype(reference_dtype).name)


def describe_avals(avals) -> str:
  return ", ".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in avals)


def _value(v) -> str:
  if isinstance(v, bool):
    return str(v)
  if isinstance(v, int):
    return str(v)
  if isinstance(v, complex):
    return f"{v.real:.7g}{v.imag:+.7g}j"
  return f"{v:.7g}"


# The table fits a terminal this wide: a long cell wraps inside its column, the widest column giving way first.
WIDTH = 100
_COLUMNS = ("check", "inputs", "output", "result", "details")
# Narrower than this a column is not made (the result, "FAIL 12/1000", stays on one line); the details get what
# the others leave.
_MIN_WIDTH = (10, 14, 6, 24, 40)
_LONGEST_WORD = 24


def _g(v: float) -> str:
  return f"{v:.4g}"


def _cells(row: Comparison) -> list[str]:
  """The row's cells; the details are paragraphs (kernel, then what was found), each wrapped on its own."""
  details = [f"kernel: {row.kernel}"] if row.kernel else []
  if row.skipped is not None:
    return [row.what, row.case, row.output, "skipped", "\n".join(details + [row.skipped])]
  if row.reference_dtype is not None:
    details.append(f"returns {row.dtype}, its reference {row.reference_dtype}; values not compared")
    return [row.what, row.case, row.output, "FAIL dtype", "\n".join(details)]
  w = row.worst
  if row.failed:
    result = f"FAIL {row.mismatches}/{row.size}"
    details.append(f"worst at {list(w.index)}: got {_value(w.got)}, want {_value(w.want)} (abs err {_g(w.abs_error)}, "
                   f"rel err {_g(w.rel_error)}" + ("" if w.ulps is None else f", {w.ulps} ULPs") +
                   f"); rtol {row.rtol:g}, atol {row.atol:g}")
  else:
    result = "ok"
    if w is None:
      details.append("no elements")
    elif w.abs_error == 0:
      details.append("equal")
    else:
      details.append(f"worst at {list(w.index)}: abs err {_g(w.abs_error)}" +
                     ("" if w.ulps is None else f", {w.ulps} ULP" + ("s" if w.ulps != 1 else "")))
  if row.passed_by_atol:
    details.append(f"{row.passed_by_atol} of {row.size} passed only by atol")
  return [row.what, row.case, row.output, result, "\n".join(details)]


def _words(text: str) -> list[str]:
  # An array's aval ("float32[192, 160]") stays on one line: only the spaces between arrays break.
  return re.sub(r"\[[^\]]*\]", lambda m: m.group(0).replace(" ", "\0"), text).split("\n")


def _wrap(text: str, width: int) -> list[str]:
  lines = []
  for paragraph in _words(text):
    lines += textwrap.wrap(paragraph, width, break_long_words=True, break_on_hyphens=False) or [""]
  return [line.replace("\0", " ") for line in lines]


def _widths(lines: list[list[str]], width: int) -> list[int]:
  """Each column's width: its widest line, narrowed (the widest column first) until the table fits ``width``."""
  n = len(_COLUMNS)
  widths = [max(len(part) for line in lines for part in _words(line[c])) for c in range(n)]
  # A column gives way down to its floor, and never below its longest word (an aval) up to _LONGEST_WORD: the
  # details wrap instead.
  words = [max(len(word) for line in lines for part in _words(line[c]) for word in part.split()) if c < n - 1 else 0
           for c in range(n)]
  floor = [min(w, max(m, min(longest, _LONGEST_WORD))) for w, m, longest in zip(widths, _MIN_WIDTH, words)]
  budget = width - 3 * (n - 1)
  while sum(widths) > budget:
    wide = max((c for c in range(n) if widths[c] > floor[c]), key=lambda c: widths[c], default=None)
    if wide is None:
      break
    widths[wide] -= 1
  return widths


def table(rows: Sequence[Comparison], width: int = WIDTH) -> str:
  """The rows as a table at most ``width`` columns wide (wider only where a column cannot be made narrower):
  every cell whole, wrapped onto more lines where it is long (a skipped row's reason in full)."""
  lines = [list(_COLUMNS)] + [_cells(r) for r in rows]
  widths = _widths(lines, width)
  out = []
  for k, line in enumerate(lines):
    wrapped = [_wrap(cell, w) for cell, w in zip(line, widths)]
    for i in range(max(len(c) for c in wrapped)):
      out.append(" | ".join((c[i] if i < len(c) else "").ljust(w) for c, w in zip(wrapped, widths)).rstrip())
    if k == 0:
      out.append("-+-".join("-" * w for w in widths))
  return "\n".join(out)


STATUSES = ("passed", "failed", "not checked")


@dataclasses.dataclass(frozen=True)
class CheckReport:
  """What `check` (or the shadow mode, `verify`) compared, row by row; ``print(report)`` shows the table.

  ``report.status`` is one of three:

  * ``"passed"``: every comparison was within its tolerance, and kernels ran (or the function calls none);
  * ``"failed"``: a comparison was not (``report.failures``), whatever ran;
  * ``"not checked"``: nothing differed, but nothing of the kernels was compared: no kernel ran (each kernel's
    fallback stood in for it: a machine without a GPU, ``JAX_MOSAIC_FFI_REFERENCE=1``), or, in the shadow mode, no
    kernel call was compared yet; ``report.not_checked`` says why.

  ``report.passed`` is True for ``"passed"`` only: a check that ran no kernel has not passed. ``report.failures``
  are the rows that differed, each a ``Comparison`` with ``what``, ``case``, ``output``, ``kernel`` (the kernel
  call and call site it is about, when it is one), ``mismatches`` of ``size`` elements, and ``worst`` (``index``,
  ``got``, ``want``, ``abs_error``, ``rel_error``, ``ulps``), or ``reference_dtype`` where the output's dtype is
  not its reference's. ``report.passed_by_atol`` counts the elements that passed only by ``atol`` (their error
  over ``rtol * |want|``), as each row and the summary do::

    >>> report = jmf.check(lambda x: x * 2, jnp.ones(8), reference=lambda x: x + x, shapes=None, seed=0)
    >>> report.status, [row.what for row in report.rows]
    ('passed', ['outputs', 'jit vs eager', 'vmap vs loop', 'VJP', 'JVP'])
    >>> print(report.summary())
    all 5 comparisons match (seed 0)

  Attributes:
    rows: every ``Comparison``, in the order made.
    seed: the seed of the random inputs (give it to `check` again to replay them).
    not_checked: why nothing of the kernels was compared ("no kernel ran: ..."), or None.
  """

  rows: tuple[Comparison, ...]
  seed: int | None = None
  not_checked: str | None = None

  @property
  def status(self) -> str:
    """``"passed"``, ``"failed"`` or ``"not checked"`` (a failure counts first: it is wrong whatever ran)."""
    if self.failures:
      return "failed"
    return "passed" if self.not_checked is None else "not checked"

  @property
  def passed(self) -> bool:
    return self.status == "passed"

  @property
  def failures(self) -> list[Comparison]:
    return [r for r in self.rows if r.failed]

  @property
  def passed_by_atol(self) -> int:
    """How many elements, over every row, passed only by ``atol`` (not within ``rtol * |want|``)."""
    return sum(r.passed_by_atol for r in self.rows)

  def summary(self) -> str:
    """One line: the status, how many comparisons were made, and the first failure or why nothing was checked."""
    made = [r for r in self.rows if r.skipped is None]
    seed = f" (seed {self.seed})" if self.seed is not None else ""
    if self.failures:
      return (f"{len(self.failures)} of {len(made)} comparisons differ{seed}; the first: "
              f"{self.failures[0].describe()}")
    by_atol = f"; {self.passed_by_atol} elements passed only by atol" if self.passed_by_atol else ""
    if self.not_checked is not None:
      made_text = f"; the {len(made)} comparisons of what ran instead match{seed}" if made else seed
      return f"not checked: {self.not_checked}{made_text}{by_atol}"
    return f"all {len(made)} comparisons match{seed}{by_atol}"

  def __str__(self) -> str:
    return "\n".join([table(self.rows), "", *textwrap.wrap(self.summary(), WIDTH, break_on_hyphens=False)])
