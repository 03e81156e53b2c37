"""`TritonLaunchOptions`: the Triton front end's own keywords of `mosaic_kernel`, and what to do instead of others.

A Triton kernel's block, shared memory, cluster and scratch come from Triton's metadata of its compile, so of the
launch it takes only the grid, its scalars, the parameters' order and whether to launch with PDL (besides the
options every front end takes, `LaunchOptions`). Its compile options (num_warps, ...) are `triton_kernel`'s
(`TritonOptions`, compiler/options.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence


@dataclasses.dataclass(frozen=True)
class TritonLaunchOptions:
  """A Triton kernel's launch options, as given: ``grid`` and ``scalars`` may be callables of ``(meta, *avals)``
  (meta: its constexprs and launch options); ``param_order`` may hold tuples (Triton tuple parameters) and
  `TensorDescriptor` declarations."""

  grid: Any = None
  scalars: Any = ()
  uses_pdl: bool | None = None
  param_order: Sequence[Any] | None = None


# What a Triton kernel's user gives instead of another front end's keyword (call/front_end.py: any other keyword
# is refused by name all the same).
HINTS = {
    "block": "Triton's metadata sets it (32 x num_warps); pass num_warps= to jmf.triton_kernel",
    "cluster": "Triton's metadata sets it (num_ctas); pass num_ctas= to jmf.triton_kernel",
    "smem_bytes": "Triton's metadata sets its shared memory",
    "collective": "Triton kernels do not get the collective metadata pointer; write a collective kernel with "
                  "jmf.cuda_kernel",
    "batch_grid_axis": "a Triton kernel's program ids are its own, so under vmap it runs once per batch element "
                       "instead",
    "scratch_bytes": "Triton's metadata sets its scratch; for a buffer of your own add an output (zero_outputs= "
                     "zeroes it before each launch)",
    "zero_scratch": "Triton's metadata sets its scratch; for a zeroed buffer of your own add an output and name it "
                    "in zero_outputs=",
}
