"""`HostCall`: a CuTe DSL launch as an extension of the one launch record (call/launch_extension.py).

A CuTe DSL object's entry is a host function that picks its own launch: it takes no kernel parameters, but the
buffers' addresses and dimensions as ``host_args`` ((kind, buffer, dimension) per argument after the stream,
compiler/plan.py), on the CuTe target of the contract (docs/contract.md), which XLA may put in a CUDA graph unless
``allow_cuda_graph=False``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jax_mosaic_ffi.base import contract
from jax_mosaic_ffi.call.launch_extension import LaunchExtension


@dataclasses.dataclass(frozen=True)
class HostCall(LaunchExtension):
  """The host function's arguments, and whether XLA may capture the call in a CUDA graph."""

  host_args: tuple[int, ...]
  graph: bool = True

  kernel_params = False

  def target(self) -> str:
    return contract.CUTE_TARGET if self.graph else contract.CUTE_NOGRAPH_TARGET

  def attributes(self) -> dict[str, Any]:
    return {"host_args": list(self.host_args)}
