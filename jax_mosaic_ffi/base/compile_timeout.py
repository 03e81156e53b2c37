"""``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``: how long one compile may run, as every front end that can stop one reads it.

NVRTC compiles in a worker process that is killed past it (cuda/nvrtc/worker.py); Triton, Gluon and the CuTe DSL
compile in a child forked for the compile, killed past it (toolchain/forked_compile.py). Read at each compile, so a
test or a user may change it between calls.

The bound is one deadline for the whole compile, whatever pieces it runs (an IR key's trace, the compile, the key
audit's witness: each in a child of its own): a front end opens `whole_compile` around them, and each piece gets
what is `left` of it, never a fresh bound.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time

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


# The deadline (time.monotonic()) of the compile this thread is in, where a front end opened one.
_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("jmf_compile_deadline", default=None)


@contextlib.contextmanager
def whole_compile(bound: float | None):
  """Inside, every piece of one compile ends by one deadline, ``bound`` seconds from now (None: no bound); inside
  another one (a compile a compile asks for), the outer deadline holds."""
  if bound is None or _deadline.get() is not None:
    yield
    return
  token = _deadline.set(time.monotonic() + bound)
  try:
    yield
  finally:
    _deadline.reset(token)


def deadline(bound: float) -> float:
  """When a piece given ``bound`` seconds from now must end: the whole compile's deadline, where it is earlier."""
  mine, whole = time.monotonic() + bound, _deadline.get()
  return mine if whole is None else min(mine, whole)
