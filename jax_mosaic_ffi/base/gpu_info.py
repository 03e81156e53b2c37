"""What the visible GPUs are, asked of the CUDA driver.

Used at trace time to pick compile targets and check launch limits. The
query goes through the C++ core's driver loader (libcuda opened at first
use): cheap, and on a machine without a driver it answers "no GPU" instead
of failing, so kernels still compile and lower there (for sm_90 by default).
That answer comes with one warning per process saying why nothing can run
here, so that a missing driver is neither silent nor a traceback.
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib.metadata
import os

from jax_mosaic_ffi.base import driver_probe
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base.native import core


class NoGpuWarning(RuntimeWarning):
  """Kernels compile and lower on this machine but cannot run on it."""


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
  gpus = tuple(GpuInfo(**gpu) for gpu in core.visible_gpus())
  reason = cannot_run_reason(gpus)
  if reason is not None:
    # At the user's line, past jax's frames too: a CuTe DSL call first asks inside jax's trace.
    source_location.warn(f"jax_mosaic_ffi: {reason}. Kernels compile (for sm_90 unless targets= says otherwise), "
                         "lower and export here, but cannot run on this machine.", NoGpuWarning)
  return gpus


@functools.cache
def driver_version() -> str:
  """The CUDA driver's version ("cuda-driver 13000"), or "no driver"."""
  try:
    version = ctypes.c_int()
    if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) == 0:
      return f"cuda-driver {version.value}"
  except OSError:
    pass
  return "no driver"


def has_gpu() -> bool:
  return bool(visible_gpus())


def cannot_run_reason(gpus) -> str | None:
  """Why kernels cannot run here, given the visible GPUs; None when they can."""
  if gpus:
    # A GPU without a CUDA-enabled jax: everything would run on the CPU.
    # Asked of the installed packages, since initialising jax's backends here
    # would be too early for jax.distributed.initialize.
    for dist in ("jax-cuda13-pjrt", "jax-cuda12-pjrt", "jax-cuda13-plugin", "jax-cuda12-plugin"):
      try:
        importlib.metadata.version(dist)
        return None
      except importlib.metadata.PackageNotFoundError:
        pass
    return (f"{gpus[0].name} is here but JAX has no CUDA backend installed "
            "(pip install 'jax_mosaic_ffi[cuda]', which brings jax[cuda13])")
  try:
    driver = ctypes.CDLL("libcuda.so.1")
  except OSError as e:
    return f"no NVIDIA GPU driver here ({e})"
  result = driver.cuInit(0)
  if result != 0:
    text = ctypes.c_char_p()
    driver.cuGetErrorString(result, ctypes.byref(text))
    return f"the NVIDIA driver did not start: {(text.value or b'error %d' % result).decode()}"
  visible = os.environ.get("CUDA_VISIBLE_DEVICES")
  if visible is not None:
    return f"the NVIDIA driver shows no GPU (CUDA_VISIBLE_DEVICES={visible!r})"
  return "the NVIDIA driver shows no GPU"


def gpu_unavailable_reason(cuda_devices: int, needed: int = 1, jax_error: str | None = None, *,
                             driver_evidence=driver_probe.evidence) -> str | None:
  """Why a test needing `needed` GPUs cannot run where jax sees `cuda_devices`; None when it can.

  Tells apart the machine without a driver from the one whose jax lacks the
  CUDA plugin: the second is a broken setup, not a CPU machine.
  """
  if cuda_devices >= needed:
    return None
  if cuda_devices > 0:
    return f"needs {needed} GPUs, found {cuda_devices}"
  signs = driver_evidence()
  if not signs:
    return "no NVIDIA driver on this machine (no libcuda.so.1, /proc/driver/nvidia or nvidia-smi)"
  said = f"; jax said: {jax_error.strip().splitlines()[0]}" if jax_error and jax_error.strip() else ""
  return (f"an NVIDIA driver is here ({', '.join(signs)}) but jax has no CUDA backend: install "
          f"jax_mosaic_ffi[cuda], or run scripts/test.sh, which does{said}")
