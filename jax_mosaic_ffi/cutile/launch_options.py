"""`CutileOptions`: the cuTile front end's own keywords of `mosaic_kernel`, and what to do instead of others'.

A tile kernel's block, shared memory and cluster are the tile compiler's (tileiras picks the threads of a tile
block and its shared memory; ``ct.kernel(num_ctas=...)`` its cluster): the call gives its grid, its runtime
scalars, optionally the order in which the call's operands fill the kernel's parameters, and whether it may be
launched with programmatic dependent launch.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class CutileOptions:
  """A cuTile kernel's launch options beyond the shared ones.

  Attributes:
    grid: the grid of tile blocks (``ct.bid``), an int or up to 3 ints, or a callable of the input avals (of
      ``(meta, *avals)`` with ``configs=``).
    scalars: numpy scalars for its runtime (non-``ct.Constant``) scalar parameters, passed by value: changing one
      compiles nothing. A callable of the avals too; ``jmf.dim_scalar`` for a size under ``jax.export``.
    param_order: which operand fills each non-constant parameter, by names ``inN``, ``outN``, ``scalarN`` (a
      tuple of names for a tuple parameter); default: inputs, outputs, then scalars, in order.
    uses_pdl: launch with programmatic dependent launch allowed; only for a kernel that calls
      ``ct.grid_dependency_control_wait()`` before it reads what the previous kernel writes.
  """

  grid: Any = None
  scalars: Any = ()
  param_order: Any = None
  uses_pdl: bool = False


# What a cuTile kernel's user gives instead of another front end's keyword (call/front_end.py: any other keyword is
# refused by name all the same).
HINTS = {
    "block": "the tile compiler picks the threads of a tile block (a tile kernel is launched with a block of one)",
    "smem_bytes": "the tile compiler sizes its shared memory (static, in the cubin)",
    "cluster": "compile it with clusters: @ct.kernel(num_ctas=2) or jmf.cutile_kernel(kernel, num_ctas=2)",
    "collective": "cuTile kernels are not collective here",
    "batch_grid_axis": "give the kernel a leading batch axis on its arrays: jmf.cutile_kernel(kernel, batch_bid=...)",
    "scratch_bytes": "add an output instead (zero_outputs= zeroes it)",
    "zero_scratch": "add an output and name it in zero_outputs=",
}
