"""What one cuTile specialization is, and the parameters its cubin takes.

A `Plan` is everything ``export_kernel`` is given besides the kernel: per kernel parameter, an array (one of the
call's buffers: dtype, rank, the width of its shape and strides, what is known of them), a runtime scalar (its
type), a compile-time constant (its value) or a tuple of those. It fixes the signature cuTile compiles for
(signature.py) and the cubin's parameters, cuTile's ``cutile_python_v1`` calling convention: per array its
address, then its shape, then its strides (in elements, row-major, as XLA lays buffers out), each an int32 or an
int64; per scalar its value; constants are compiled in and take no parameter. Shapes are not compiled in (only
whether each extent and stride is a multiple of 16 bytes' worth, as cuTile's JAX bridge assumes), so one compile
serves every shape of that kind, and a symbolic shape under `jax.export` is passed at run time. Needs no cuTile.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from jax.export import is_symbolic_dim

# What XLA aligns every buffer to (the runtime checks it): the base addresses the kernel may assume.
XLA_BUFFER_ALIGNMENT = 256
# A shape or stride known to be a multiple of this many elements (or of 16 bytes' worth) is compiled as such.
DIVISOR = 16
INT32_MAX = (1 << 31) - 1
# numpy dtype names of runtime scalars, as cuTile names its types (a bool travels as an int32, as cuda.tile.jax does).
SCALAR_TYPES = {"int8": "int8", "int16": "int16", "int32": "int32", "int64": "int64", "uint8": "uint8",
                "uint16": "uint16", "uint32": "uint32", "uint64": "uint64", "float16": "float16",
                "bfloat16": "bfloat16", "float32": "float32", "float64": "float64", "bool": "int32"}


def _known(extent) -> int | None:
  return None if is_symbolic_dim(extent) else int(extent)


@dataclasses.dataclass(frozen=True)
class ArrayArg:
  """One buffer (inputs, then outputs) as an array parameter: row-major, ``index_bits`` wide shape and strides;
  ``alias_group``: a name it shares with the other parameters that may be the same memory (an input passed
  twice), None for none."""

  buffer: int
  dtype: str
  shape: tuple[Any, ...]  # ints, or jax.export symbolic dimensions
  index_bits: int = 32
  alias_group: str | None = None

  @property
  def rank(self) -> int:
    return len(self.shape)

  def strides(self) -> tuple[Any, ...]:
    """Row-major strides in elements (symbolic where a later extent is)."""
    out, stride = [], 1
    for extent in reversed(self.shape):
      out.append(stride)
      stride = stride * extent
    return tuple(reversed(out))

  def divisors(self, itemsize: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(per dimension, the factor its extent is known to be a multiple of; per dimension, its stride's), as
    cuda.tile.jax assumes them: 16 elements for an extent, 16 bytes' worth for a stride, else 1."""
    stride_divisor = 16 // itemsize if itemsize and 16 % itemsize == 0 else 1
    shape_div = tuple(DIVISOR if (n := _known(e)) is not None and n % DIVISOR == 0 else 1 for e in self.shape)
    stride_div = []
    for d in range(self.rank):
      concrete = math.prod(n for e in self.shape[d + 1:] if (n := _known(e)) is not None)
      stride_div.append(stride_divisor if concrete % stride_divisor == 0 else 1)
    return shape_div, tuple(stride_div)

  def too_wide(self) -> str | None:
    """Which extent or stride does not fit a 32-bit index (known ones only; the runtime checks symbolic ones)."""
    if self.index_bits == 64:
      return None
    for d, (extent, stride) in enumerate(zip(self.shape, self.strides())):
      for what, value in (("extent", extent), ("stride", stride)):
        if (n := _known(value)) is not None and n > INT32_MAX:
          return f"dimension {d}'s {what} {n}"
    return None

  def describe(self, itemsize: int) -> list:
    shape_div, stride_div = self.divisors(itemsize)
    return ["array", self.dtype, self.rank, self.index_bits, shape_div, stride_div, self.alias_group]


@dataclasses.dataclass(frozen=True)
class ScalarArg:
  """Scalar ``index`` of the call, passed at launch as a ``dtype`` (a key of SCALAR_TYPES)."""

  index: int
  dtype: str

  def describe(self, itemsize: int = 0) -> list:
    return ["scalar", SCALAR_TYPES[self.dtype]]


@dataclasses.dataclass(frozen=True)
class ConstantArg:
  """A compile-time constant (``ct.Constant``): compiled in, keyed by its value (``key``: its exact key, hex)."""

  value: Any
  key: str

  def describe(self, itemsize: int = 0) -> list:
    return ["constant", self.key]


@dataclasses.dataclass(frozen=True)
class TupleArg:
  items: tuple[Any, ...]

  def describe(self, itemsizes) -> list:
    return ["tuple", [item.describe(itemsizes(item)) if not isinstance(item, TupleArg) else item.describe(itemsizes)
                      for item in self.items]]


@dataclasses.dataclass(frozen=True)
class Launched:
  """One parameter of the cubin: ``kind`` "buffer" (``buffer``'s address), "extent" / "stride" (``buffer``'s
  ``dim``, an ``bits`` wide integer) or "scalar" (the call's scalar ``index``)."""

  kind: str
  buffer: int = -1
  dim: int = -1
  bits: int = 0
  index: int = -1


@dataclasses.dataclass(frozen=True)
class Plan:
  """One specialization: per kernel parameter an `ArrayArg`, `ScalarArg`, `ConstantArg` or `TupleArg`."""

  args: tuple[Any, ...]

  def leaves(self):
    def walk(items):
      for item in items:
        if isinstance(item, TupleArg):
          yield from walk(item.items)
        else:
          yield item
    return walk(self.args)

  def arrays(self) -> tuple[ArrayArg, ...]:
    return tuple(a for a in self.leaves() if isinstance(a, ArrayArg))

  def launched(self) -> tuple[Launched, ...]:
    """The cubin's parameters in order (cutile_python_v1)."""
    out = []
    for a in self.leaves():
      if isinstance(a, ArrayArg):
        out.append(Launched("buffer", a.buffer))
        out += [Launched("extent", a.buffer, d, a.index_bits) for d in range(a.rank)]
        out += [Launched("stride", a.buffer, d, a.index_bits) for d in range(a.rank)]
      elif isinstance(a, ScalarArg):
        out.append(Launched("scalar", index=a.index))
    return tuple(out)

  def describe(self, itemsize) -> str:
    """Everything of the plan that changes the compiled code, as text for the key (``itemsize(array)``: its
    element's bytes). Extents are not in it: they are launch values."""
    sizes = lambda a: itemsize(a) if isinstance(a, ArrayArg) else 0  # noqa: E731
    return json.dumps([a.describe(sizes) if isinstance(a, TupleArg) else a.describe(sizes(a)) for a in self.args])
