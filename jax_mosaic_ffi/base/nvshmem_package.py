"""Where NVSHMEM is installed: the ``nvidia-nvshmem-cu13`` wheel (``pip install 'jax_mosaic_ffi[nvshmem]'``).

Kernels that call NVSHMEM need its headers and device library to compile and link, and its host library to
run; nothing of it is linked into the extension, so the package installs and imports without it. This module
only finds the files and names the release; it loads nothing.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import re

from jax_mosaic_ffi.base import wheel_record
from jax_mosaic_ffi.base.errors import NvshmemUnavailable

INSTALL_HINT = "pip install 'jax_mosaic_ffi[nvshmem]' (the nvidia-nvshmem-cu13 wheel)"
# The releases whose device-library ABI and init structures (csrc/driver/nvshmem_host.h) are known here.
SUPPORTED_MAJOR = 3
# 3.8 moved the device transfer code out of libnvshmem_device.a into per-architecture bitcode
# (libnvshmem_device_sm_XX.bc), which nvJitLink does not take: its kernels link with undefined
# nvshmemi_transfer_* references. 3.4 (the H200's) to 3.7 link and run.
NEWEST_SUPPORTED = (3, 7)


@dataclasses.dataclass(frozen=True)
class NvshmemPackage:
  """The installed NVSHMEM: its folders and files, and its release."""

  include_dir: pathlib.Path
  device_library: pathlib.Path  # libnvshmem_device.a: linked into each kernel that calls NVSHMEM
  host_library: pathlib.Path    # libnvshmem_host.so.3: opened by the runtime (dlopen)
  version: tuple[int, int, int]

  @property
  def identity(self) -> str:
    """What a compile cache key needs: the release and the device library it links, by its wheel's RECORD (the
    same wherever the wheel is installed: base/wheel_record.py), else by its path, size and time."""
    release = f"nvshmem{'.'.join(map(str, self.version))}"
    found = wheel_record.identity(self.device_library, ("nvidia-nvshmem-cu13", "nvidia-nvshmem-cu12"))
    if found is not None:
      return f"{release}:{found}"
    stat = self.device_library.stat()
    return f"{release}:{self.device_library}:{stat.st_size}:{int(stat.st_mtime)}"


def _version(include_dir: pathlib.Path) -> tuple[int, int, int] | None:
  try:
    text = (include_dir / "non_abi" / "nvshmem_version.h").read_text(errors="replace")
  except OSError:
    return None
  parts = [re.search(rf"#define\s+NVSHMEM_VENDOR_{p}_VERSION\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
  if not all(parts):
    return None
  return tuple(int(m.group(1)) for m in parts)  # type: ignore[union-attr]


@functools.cache
def find() -> NvshmemPackage | None:
  """The installed NVSHMEM, or None where it is not (or is incomplete, or of another major release)."""
  try:
    import nvidia  # noqa: PLC0415  (the namespace of NVIDIA's wheels, present only when one is installed)
  except ImportError:
    return None
  for base in getattr(nvidia, "__path__", ()):
    root = pathlib.Path(base) / "nvshmem"
    include_dir, lib = root / "include", root / "lib"
    device, host = lib / "libnvshmem_device.a", lib / "libnvshmem_host.so.3"
    version = _version(include_dir)
    if (include_dir / "nvshmem.h").is_file() and device.is_file() and host.is_file() and version is not None \
        and version[0] == SUPPORTED_MAJOR:
      return NvshmemPackage(include_dir, device, host, version)
  return None


def require(what: str) -> NvshmemPackage:
  """The installed NVSHMEM, or NvshmemUnavailable saying how to install it, for `what` ("cuda_kernel 'x'")."""
  package = find()
  if package is None:
    raise NvshmemUnavailable(
        f"{what} needs NVSHMEM {SUPPORTED_MAJOR}.x, which is not installed: {INSTALL_HINT}")
  if package.version[:2] > NEWEST_SUPPORTED:
    newest = ".".join(map(str, NEWEST_SUPPORTED))
    raise NvshmemUnavailable(
        f"{what} needs NVSHMEM {SUPPORTED_MAJOR}.4 to {newest}; {'.'.join(map(str, package.version))} is installed, "
        f"whose device library no longer holds the transfer code kernels link against: "
        f"pip install 'nvidia-nvshmem-cu13>=3.4,<3.8'")
  return package
