"""`LaunchExtension`: what a front end adds to the one launch record every front end shares.

A launch is a kernel entry launched with its parameters (`LaunchSpec.param_order`). A module whose entry is
something else (a CuTe DSL object's host function, which picks its own launch: cute/host_call.py) says so through
an extension on its `LaunchSpec`: the custom-call target of its image kind, the contract attributes only that
target reads, and whether the entry takes kernel parameters at all. The record itself names no front end, and
the call layer reads an extension only through this interface.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class LaunchExtension:
  """The base of a front end's extension of a launch; subclasses are frozen dataclasses (hashable, compared by
  value), and every field is part of what is launched (`LaunchSpec.identity`)."""

  # Whether the module's entry takes the kernel parameters of `LaunchSpec.param_order`.
  kernel_params = True

  def target(self) -> str:
    """The custom-call target (base/contract.py) of this launch."""
    raise NotImplementedError

  def attributes(self) -> dict[str, Any]:
    """The contract attributes this launch adds (docs/contract.md), as Python values."""
    return {}

  def identity(self) -> dict[str, Any]:
    """Its fields, as plain values, for the launch's identity."""
    return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
