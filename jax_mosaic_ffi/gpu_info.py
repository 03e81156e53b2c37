"""What the visible GPUs are, asked of the CUDA driver through cuda-python.

Used at trace time to pick compile targets and check launch limits. On a
machine without a driver every query answers "no GPU" instead of failing,
so kernels still compile and lower there (for sm_90 by default).
"""

from __future__ import annotations

import dataclasses
import functools


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
  try:
    from cuda.bindings import driver
  except ImportError:
    return ()
  try:
    (err,) = driver.cuInit(0)
    if err != driver.CUresult.CUDA_SUCCESS:
      return ()
    err, count = driver.cuDeviceGetCount()
    if err != driver.CUresult.CUDA_SUCCESS:
      return ()
    attr = driver.CUdevice_attribute

    def get(device, which):
      err, value = driver.cuDeviceGetAttribute(which, device)
      if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuDeviceGetAttribute({which}) failed: {err}")
      return value

    gpus = []
    for ordinal in range(count):
      err, device = driver.cuDeviceGet(ordinal)
      if err != driver.CUresult.CUDA_SUCCESS:
        continue
      err, name = driver.cuDeviceGetName(256, device)
      major = get(device, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)
      minor = get(device, attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)
      gpus.append(GpuInfo(
          ordinal=ordinal,
          name=name.split(b"\0", 1)[0].decode(errors="replace"),
          arch=major * 10 + minor,
          max_shared_memory_per_block_optin=get(
              device, attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
          max_threads_per_block=get(device, attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
          max_grid=tuple(get(device, a) for a in (
              attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X,
              attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y,
              attr.CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z)),
          max_block=tuple(get(device, a) for a in (
              attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X,
              attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y,
              attr.CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z)),
      ))
    return tuple(gpus)
  except Exception:  # a broken driver install must not break tracing
    return ()


def has_gpu() -> bool:
  return bool(visible_gpus())


@functools.cache
def driver_version() -> int | None:
  """The CUDA version the driver supports, e.g. 13000, or None without one."""
  try:
    from cuda.bindings import driver
    err, version = driver.cuDriverGetVersion()
    return version if err == driver.CUresult.CUDA_SUCCESS and version else None
  except Exception:
    return None
