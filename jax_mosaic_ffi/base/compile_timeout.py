"""``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``: how long one compile may run, as every front end that can stop one reads it.

NVRTC compiles in a worker process that is killed past it (cuda/nvrtc/worker.py); Triton, Gluon and the CuTe DSL
compile in a child forked for the compile, killed past it (toolchain/forked_compile.py). Read at each compile, so a
test or a user may change it between calls.
"""

from __future__ import annotations

import os

from jax_mosaic_ffi.base import flags

ENV = flags.COMPILE_TIMEOUT_S
DEFAULT_S = 300.0
# Longer bounds are taken as this one: select() cannot wait 1e10 s (OverflowError).
MAX_S = 7 * 24 * 3600.0


def seconds() -> float | None:
  """The bound from the environment, in seconds; None means no bound (``0``). ValueError naming the setting for a
  value that is not a finite number >= 0."""
  value = os.environ.get(ENV, "").strip()
  if not value:
    return DEFAULT_S
  try:
    bound = float(value)
  except ValueError:
    raise ValueError(f"{ENV} must be a number of seconds (0 for no bound), got {value!r}") from None
  if not 0 <= bound < float("inf"):  # nan too
    raise ValueError(f"{ENV} must be a finite number of seconds >= 0 (0: no bound, and every compiler runs in "
                     f"this process), got {value!r}")
  return None if bound == 0 else min(bound, MAX_S)


def describe(bound: float) -> str:
  """The setting as a message names it: ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S=300``."""
  return f"{ENV}={bound:g}" if os.environ.get(ENV, "").strip() else f"{ENV} (default {bound:g})"
