"""`CuteOptions`: the CuTe DSL front end's own keywords of `mosaic_kernel`: none, and what to do instead of others.

A CuTe DSL launcher picks its own launch (grid, block, shared memory, clusters) when it runs, and its non-tensor
arguments are compile-time constants, so it takes only the options every front end takes (`LaunchOptions`);
how it is compiled is `cute_kernel`'s (specs, static tensors, compile options, a batch mode).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CuteOptions:
  """A CuTe DSL launcher's launch options: none beyond the shared ones."""


# What a CuTe DSL launcher's user gives instead of another front end's keyword (call/front_end.py: any other keyword
# is refused by name all the same).
HINTS = {
    "grid": "it picks its own launch",
    "block": "it picks its own launch",
    "cluster": "it picks its own launch",
    "smem_bytes": "it picks its own shared memory",
    "uses_pdl": "it launches its kernels itself",
    "scalars": "pass non-tensor values as constexpr keyword arguments of jmf.cute_kernel (or configs=)",
    "param_order": "it takes (stream, *inputs, *outputs, **constexprs)",
    "collective": "CuTe DSL kernels are not collective here",
    "batch_grid_axis": "under vmap the host function runs once per batch element, or once on the whole batch for "
                       "a launcher whose tensors take a batch mode (cute_kernel(batch_mode=))",
    "scratch_bytes": "add an output instead (zero_outputs= zeroes it)",
    "zero_scratch": "add an output and name it in zero_outputs=",
}
