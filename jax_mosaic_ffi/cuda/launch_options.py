"""`CudaOptions`: the CUDA front end's own launch options, as given to `mosaic_kernel` (its docstring documents each).

A CUDA C++, PTX or cubin kernel is launched exactly as asked: grid, block, cluster, dynamic shared memory, PDL,
scalars by value, its parameters' order (with TMA descriptors), a collective, a batch on a grid axis, a scratch
buffer. These are this front end's keywords of `mosaic_kernel` beyond the ones every front end takes
(`LaunchOptions`); `launch.py` checks them once into the launch record.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from jax_mosaic_ffi.call.collective import Collective


@dataclasses.dataclass(frozen=True)
class CudaOptions:
  """A CUDA kernel's launch options, as given. Any of grid, block, smem_bytes, scalars and scratch_bytes may be
  a callable of the input avals (of ``(meta, *avals)`` under an autotuning config)."""

  grid: Any = None
  block: Any = None
  cluster: Any = None
  smem_bytes: Any = 0
  uses_pdl: bool | None = None
  scalars: Any = ()
  param_order: Sequence[Any] | None = None
  collective: Collective | None = None
  batch_grid_axis: str | None = None
  scratch_bytes: Any = 0
  zero_scratch: bool = False
