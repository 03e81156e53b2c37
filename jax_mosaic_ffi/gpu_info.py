"""What the visible GPUs are, asked of the CUDA driver.

Used at trace time to pick compile targets and check launch limits. The
query goes through the C++ core's driver loader (libcuda opened at first
use): cheap, and on a machine without a driver it answers "no GPU" instead
of failing, so kernels still compile and lower there (for sm_90 by default).
"""

from __future__ import annotations

import dataclasses
import functools

from jax_mosaic_ffi import _core


@dataclasses.dataclass(frozen=True)
class GpuInfo:
  ordinal: int
  name: str
  arch: int  # compute capability as major * 10 + minor
  max_shared_memory_per_block_optin: int
  max_threads_per_block: int
  max_grid: tuple[int, int, int]
  max_block: tuple[int, int, int]


@functools.cache
def visible_gpus() -> tuple[GpuInfo, ...]:
  return tuple(GpuInfo(**gpu) for gpu in _core.visible_gpus())


def has_gpu() -> bool:
  return bool(visible_gpus())
