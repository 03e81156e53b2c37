"""``JAX_MOSAIC_FFI_COMPILE_JOBS``: how many compiles run side by side in this process, as the store's pool of
compiles made ahead (store/ahead.py) and NVRTC's worker processes (cuda/nvrtc/worker.py) read it.

Default: the CPUs this process may run on (``os.sched_getaffinity``), as a compile keeps one busy; a process pinned
to one core compiles one kernel at a time. Read where a pool grows, so a test or a user may change it between calls.
"""

from __future__ import annotations

import os

from jax_mosaic_ffi.base import flags

ENV = flags.COMPILE_JOBS
MAX_JOBS = 256


def count() -> int:
  """The number of compiles that may run at once (>= 1); ValueError naming the setting for a value that is not a
  whole number >= 1."""
  value = os.environ.get(ENV, "").strip()
  if not value:
    try:
      cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
      cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_JOBS))
  try:
    jobs = int(value)
  except ValueError:
    raise ValueError(f"{ENV} must be a whole number of compiles >= 1, got {value!r}") from None
  if jobs < 1:
    raise ValueError(f"{ENV} must be a whole number of compiles >= 1 (1: one at a time), got {value!r}")
  return min(jobs, MAX_JOBS)
