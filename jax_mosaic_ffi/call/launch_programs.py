"""A grid and integer scalars that depend on symbolic shapes (jax.export with shape polymorphism).

A launch value is fixed when the call is lowered, but a symbolic size (``n`` of
``jax.export.symbolic_shape("n")``) is only known when the exported function is
called. So a grid dimension or integer scalar that is an expression of symbolic
sizes (``jmf.cdiv(x.shape[0], 256)``, ``jmf.dim_scalar(x.size, np.int32)``) is
lowered as a small postfix program over the dimensions of the call's buffers
(the `launch_programs` attribute of contract v2, docs/contract.md); the runtime
runs it once per compiled call site, when the shapes are known, with checked
int64 arithmetic (csrc/contract/launch_programs.cc).

jax's symbolic expressions are sums of terms, each a product of factors (a
dimension variable, or floordiv / mod / max / min of two expressions); no
public API walks them, so this module reads that structure in one place and
refuses, with a message, an expression it does not recognise.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.export import is_symbolic_dim

from jax_mosaic_ffi.base.errors import LaunchError

# Targets and operations: csrc/contract/launch_programs.h.
GRID, SIGNED_SCALAR, UNSIGNED_SCALAR = 0, 1, 2
CONST, DIM, ADD, MUL, FLOORDIV, MOD, MAX, MIN = range(8)
_OPERATIONS = {"floordiv": FLOORDIV, "mod": MOD, "max": MAX, "min": MIN}


@dataclasses.dataclass(frozen=True)
class DimScalar:
  """An integer scalar whose value is an expression of symbolic sizes, and its dtype."""

  value: Any
  dtype: np.dtype


def dim_scalar(value, dtype=np.int32):
  """An integer kernel scalar computed from array sizes: ``jmf.dim_scalar(x.shape[0], np.int32)``.

  On concrete shapes it is ``np.int32(x.shape[0])``. On symbolic ones (`jax.export` with shape
  polymorphism), where ``np.int32(...)`` cannot be computed, the runtime computes it when the exported
  function is called, and refuses a value that does not fit the dtype
  (:doc:`symbolic shapes </guides/transformations>`)::

    >>> jmf.dim_scalar(1000, np.int32)
    np.int32(1000)
    >>> (m,) = jax.export.symbolic_shape("m")
    >>> jmf.dim_scalar(m, np.int32)     # computed by the runtime when the size is known
    DimScalar(value=m, dtype=dtype('int32'))
  """
  dtype = np.dtype(dtype)
  if dtype.kind not in "iu":
    raise TypeError(f"jmf.dim_scalar takes an integer dtype (np.int32, np.int64, np.uint32, ...), got {dtype}")
  if is_symbolic_dim(value):
    return DimScalar(value, dtype)
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise TypeError(f"jmf.dim_scalar takes a size (an int, or a symbolic dimension), got {value!r}")
  info = np.iinfo(dtype)
  if not info.min <= int(value) <= info.max:
    raise OverflowError(f"jmf.dim_scalar: {value} does not fit {dtype}")
  return dtype.type(value)


def _var_refs(shapes) -> dict[str, tuple[int, int]]:
  """Each dimension variable that is a whole dimension of a buffer: (buffer, axis), the first one found."""
  refs: dict[str, tuple[int, int]] = {}
  for b, shape in enumerate(shapes):
    for axis, d in enumerate(shape):
      if is_symbolic_dim(d):
        var = d._to_var()  # noqa: SLF001  (no public API: module doc)
        if var is not None:
          refs.setdefault(var, (b, axis))
  return refs


class _Unencodable(Exception):
  pass


def _expression(e, refs, variables: list[str]) -> list[int]:
  if not is_symbolic_dim(e):
    return [CONST, int(e)]
  code: list[int] = []
  for term, coeff in e._sorted_terms:  # noqa: SLF001
    term_code: list[int] = []
    for factor, power in term._factors:  # noqa: SLF001
      factor_code = _factor(factor, refs, variables)
      for _ in range(int(power)):
        term_code = factor_code if not term_code else term_code + factor_code + [MUL]
    if not term_code:
      term_code = [CONST, int(coeff)]
    elif int(coeff) != 1:
      term_code = term_code + [CONST, int(coeff), MUL]
    code = term_code if not code else code + term_code + [ADD]
  return code or [CONST, 0]


def _factor(factor, refs, variables: list[str]) -> list[int]:
  if factor.var is not None:
    if factor.var not in refs:
      variables.append(factor.var)
      raise _Unencodable(factor.var)
    return [DIM, *refs[factor.var]]
  if factor.operation not in _OPERATIONS or len(factor.operands) != 2:
    raise _Unencodable(str(factor.operation))
  a, b = factor.operands
  return _expression(a, refs, variables) + _expression(b, refs, variables) + [_OPERATIONS[factor.operation]]


def _describe(shapes, n_in: int) -> str:
  names = [f"in{b}" if b < n_in else f"out{b - n_in}" for b in range(len(shapes))]
  return "; ".join(f"{name}[{', '.join(map(str, s))}]" for name, s in zip(names, shapes))


def encode(value, what: str, shapes, n_in: int, where: str) -> list[int]:
  """The postfix code of one symbolic launch value over the buffers' dimensions (inputs, then outputs)."""
  variables: list[str] = []
  try:
    return _expression(value, _var_refs(shapes), variables)
  except _Unencodable:
    if variables:
      raise LaunchError(
          f"{where}: {what} = {value} uses the symbolic dimension {variables[0]!r}, which is not a whole dimension "
          f"of any input or output of the call ({_describe(shapes, n_in)}); the runtime reads it from one. Pass an "
          f"array whose shape has {variables[0]} as one of its dimensions") from None
    raise LaunchError(f"{where}: {what} = {value} is a symbolic expression this jax_mosaic_ffi cannot compute at "
                      f"run time (jax {jax.__version__}); export once per concrete size") from None
  except AttributeError as e:  # jax changed how it represents expressions
    raise LaunchError(f"{where}: {what} = {value}: this jax ({jax.__version__}) represents symbolic expressions in "
                      f"a way jax_mosaic_ffi does not read ({e}); export once per concrete size") from None


def program(target: int, index: int, code: list[int]) -> list[int]:
  return [target, index, len(code), *code]


def placeholder_scalar(dtype: np.dtype) -> bytes:
  """The scalar_data bytes of a computed scalar: zero, overwritten by the runtime before any launch."""
  return bytes(dtype.itemsize)
