"""A launch's operands named by typed references: `Operand`, an input, an output, a scalar or the scratch buffer.

Users name operands as text (``param_order=("out0", "in0", "scalar0")``, ``jmf.TensorMap("in1", ...)``,
``residuals=("out0",)``); `parse` reads such a name once, where it enters, and everything after passes the
`Operand` on: the launch record, the parameter codes of the contract, the front ends' own orders (a Triton
kernel's tuple parameters, its scratch outputs, its host tensor descriptors).
"""

from __future__ import annotations

import dataclasses
import enum
import re


class Kind(enum.Enum):
  IN = "in"
  OUT = "out"
  SCALAR = "scalar"
  SCRATCH = "scratch"


_NAME = re.compile(r"(in|out|scalar)(0|[1-9][0-9]*)|scratch")


@dataclasses.dataclass(frozen=True)
class Operand:
  """One operand of a launch: input ``index``, output ``index``, scalar ``index`` or the scratch buffer. Its text
  (``str``) is the name users write."""

  kind: Kind
  index: int = 0

  def __str__(self) -> str:
    return "scratch" if self.kind is Kind.SCRATCH else f"{self.kind.value}{self.index}"

  @property
  def is_buffer(self) -> bool:
    return self.kind is not Kind.SCALAR


def parse(name) -> Operand | None:
  """The operand a name (``"in0"``, ``"out2"``, ``"scalar1"``, ``"scratch"``) refers to, or None."""
  match = _NAME.fullmatch(name) if isinstance(name, str) else None
  if match is None:
    return None
  if match.group(1) is None:
    return SCRATCH
  return Operand(Kind(match.group(1)), int(match.group(2)))


def input_(index: int) -> Operand:
  return Operand(Kind.IN, index)


def output(index: int) -> Operand:
  return Operand(Kind.OUT, index)


def scalar(index: int) -> Operand:
  return Operand(Kind.SCALAR, index)


SCRATCH = Operand(Kind.SCRATCH)


def default_order(n_in: int, n_out: int, n_scalars: int) -> tuple[Operand, ...]:
  """The parameters of a kernel without ``param_order``: inputs, outputs, then scalars."""
  return (tuple(input_(i) for i in range(n_in)) + tuple(output(o) for o in range(n_out))
          + tuple(scalar(k) for k in range(n_scalars)))


def buffer_index(operand: Operand, n_in: int, n_out: int) -> int:
  """The buffer's index among the call's buffers (inputs, then outputs, then the scratch buffer)."""
  if operand.kind is Kind.IN:
    return operand.index
  if operand.kind is Kind.OUT:
    return n_in + operand.index
  if operand.kind is Kind.SCRATCH:
    return n_in + n_out
  raise ValueError(f"{operand} is a scalar, not a buffer")
