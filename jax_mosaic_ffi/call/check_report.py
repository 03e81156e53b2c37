"""What a check found: one `Comparison` per array compared, and the `CheckReport` of them all, printable as a table.

`jmf.check` and the shadow mode (`jmf.verify`, ``JAX_MOSAIC_FFI_VERIFY``) both make these, from the numbers
`numerics.summarize` computes on the device.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jax_mosaic_ffi.call import numerics


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

  @property
  def failed(self) -> bool:
    return self.skipped is None and self.mismatches > 0

  def describe(self) -> str:
    """One sentence: what was compared and, for a mismatch, where and by how much."""
    head = f"{self.what}, {self.output} ({self.dtype}{list(self.shape)}) for inputs ({self.case})"
    if self.kernel:
      head += f", {self.kernel}"
    if self.skipped is not None:
      return f"{head}: not compared: {self.skipped}"
    if not self.failed:
      return f"{head}: matches"
    w = self.worst
    detail = (f"worst at {list(w.index)}: got {_value(w.got)}, want {_value(w.want)} (abs error {_value(w.abs_error)}, "
              f"rel error {_value(w.rel_error)}" + (f", {w.ulps} ULPs" if w.ulps is not None else "") + ")")
    return (f"{head}: {self.mismatches} of {self.size} elements differ beyond rtol={self.rtol:g}, "
            f"atol={self.atol:g}; {detail}")


def compared(what: str, case: str, output: str, kernel: str | None, shape, dtype, rtol: float, atol: float,
             summary: Sequence) -> Comparison:
  """The row of one `numerics.summarize` result (numpy values on the host)."""
  mismatches, worst, got, want, _ = summary
  size = int(np.prod(shape)) if shape else 1
  found = numerics.worst_element(tuple(shape), dtype, int(worst), got, want) if size else None
  return Comparison(what, case, output, kernel, np.dtype(dtype).name, tuple(int(d) for d in shape), rtol, atol,
                    int(mismatches), size, found)


def skipped(what: str, case: str, output: str, kernel: str | None, why: str, shape=(), dtype="float32") -> Comparison:
  return Comparison(what, case, output, kernel, np.dtype(dtype).name, tuple(shape), 0.0, 0.0, skipped=why)


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


# A skipped row's reason is cut to this in the table (`Comparison.describe` has it whole).
_SKIP_WIDTH = 72
_COLUMNS = ("check", "inputs", "output", "kernel", "result", "worst at", "got", "want", "abs err", "rel err", "ULPs",
            "rtol / atol")


def _cells(row: Comparison) -> list[str]:
  if row.skipped is not None:
    why = row.skipped if len(row.skipped) <= _SKIP_WIDTH else row.skipped[:_SKIP_WIDTH - 3] + "..."
    return [row.what, row.case, row.output, row.kernel or "", "skipped: " + why] + [""] * 7
  result = f"FAIL {row.mismatches}/{row.size}" if row.failed else "ok"
  w = row.worst
  if w is None:
    return [row.what, row.case, row.output, row.kernel or "", result] + [""] * 6 + [f"{row.rtol:g} / {row.atol:g}"]
  return [row.what, row.case, row.output, row.kernel or "", result, str(list(w.index)), _value(w.got), _value(w.want),
          _value(w.abs_error), _value(w.rel_error), "" if w.ulps is None else str(w.ulps),
          f"{row.rtol:g} / {row.atol:g}"]


@dataclasses.dataclass(frozen=True)
class CheckReport:
  """What `check` (or the shadow mode, `verify`) compared, row by row; ``print(report)`` shows the table.

  ``report.passed`` says whether every comparison was within its tolerance (skipped ones say why in the table);
  ``report.failures`` are the rows that were not, each a ``Comparison`` with ``what``, ``case``, ``output``,
  ``kernel`` (the kernel call and call site it is about, when it is one), ``mismatches`` of ``size`` elements, and
  ``worst`` (``index``, ``got``, ``want``, ``abs_error``, ``rel_error``, ``ulps``)::

    >>> report = jmf.check(lambda x: x * 2, jnp.ones(8), reference=lambda x: x + x, shapes=None, seed=0)
    >>> report.passed, [row.what for row in report.rows]
    (True, ['outputs', 'jit vs eager', 'vmap vs loop', 'VJP', 'JVP'])
    >>> print(report.summary())
    all 5 comparisons match (seed 0)

  Attributes:
    rows: every ``Comparison``, in the order made.
    seed: the seed of the random inputs (give it to `check` again to replay them).
  """

  rows: tuple[Comparison, ...]
  seed: int | None = None

  @property
  def passed(self) -> bool:
    return not self.failures

  @property
  def failures(self) -> list[Comparison]:
    return [r for r in self.rows if r.failed]

  def summary(self) -> str:
    """One line: how many comparisons failed, and the first of them."""
    made = [r for r in self.rows if r.skipped is None]
    if not self.failures:
      return f"all {len(made)} comparisons match" + (f" (seed {self.seed})" if self.seed is not None else "")
    return (f"{len(self.failures)} of {len(made)} comparisons differ" +
            (f" (seed {self.seed})" if self.seed is not None else "") + "; the first: " + self.failures[0].describe())

  def __str__(self) -> str:
    table = [list(_COLUMNS)] + [_cells(r) for r in self.rows]
    widths = [max(len(line[c]) for line in table) for c in range(len(_COLUMNS))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip() for line in table]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines + ["", self.summary()])
