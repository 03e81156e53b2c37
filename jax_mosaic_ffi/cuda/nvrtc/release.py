"""The CUDA toolchain a compile uses (NVRTC, nvJitLink with its ptxas, the driver), checked together at the first
compile, so that releases that cannot work together are named with the command that fixes them.

NVRTC writes PTX of its own release (NVRTC 13.5: ``.version 9.5``); nvJitLink's ptxas, which builds every PDL-safe
kernel (the default on sm_90 and newer) and every NVSHMEM kernel, reads PTX up to its own release. So an NVRTC newer
than nvJitLink fails nearly every compile with ``ptxas ... Unsupported .version 9.5; current version is '9.0'``:
what ``pip install nvidia-cuda-nvrtc`` (the newest) beside another package's pin of nvJitLink leaves. And a cubin
of CUDA 13 needs a driver for CUDA 13. The versions are the libraries' own (`Toolchain.installed`), and the
packages that brought them, by their distributions' metadata. The check is a pure function of them (`problems`)::

    >>> nvrtc_13_5 = Toolchain(nvrtc=(13, 5), nvjitlink=(13, 0), driver=13000,
    ...                        packages={"nvidia-cuda-nvrtc": "13.5.37", "nvidia-nvjitlink": "13.0.88"})
    >>> print(problems(nvrtc_13_5, {"nvidia-cuda-nvrtc": "==13.0.*", "nvidia-nvjitlink": "==13.0.*"})[0])
    NVRTC 13.5 (nvidia-cuda-nvrtc 13.5.37) is newer than nvJitLink 13.0 (nvidia-nvjitlink 13.0.88): ...
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import re

from jax_mosaic_ffi.base import gpu_info
from jax_mosaic_ffi.base import source_location

NVRTC_PACKAGES = ("nvidia-cuda-nvrtc", "nvidia-cuda-nvrtc-cu13", "nvidia-cuda-nvrtc-cu12")
NVJITLINK_PACKAGES = ("nvidia-nvjitlink", "nvidia-nvjitlink-cu13", "nvidia-nvjitlink-cu12")
_THIS_PACKAGE = "jax_mosaic_ffi"


@dataclasses.dataclass(frozen=True)
class Toolchain:
  """The releases a compile uses: NVRTC's and nvJitLink's (major, minor), as the loaded libraries say (nvJitLink
  None where it cannot be loaded), the driver's CUDA version (13000 for 13.0; None without a driver), and the
  versions of the packages that brought them ({distribution: version})."""

  nvrtc: tuple[int, int]
  nvjitlink: tuple[int, int] | None
  driver: int | None
  packages: dict[str, str]

  @staticmethod
  def installed() -> "Toolchain":
    """This process's toolchain (loads NVRTC and nvJitLink: tens of milliseconds, once)."""
    from cuda.bindings import nvrtc  # noqa: PLC0415  (loaded at the first compile, as program.py does)
    err, major, minor = nvrtc.nvrtcVersion()
    try:
      from cuda.bindings import nvjitlink  # noqa: PLC0415  (loaded only for the check, as program.py does)
      linker = tuple(int(v) for v in nvjitlink.version())[:2]
    except Exception:  # noqa: BLE001  (not installed, or its library not found: nothing to compare)
      linker = None
    driver = re.fullmatch(r"cuda-driver (\d+)", gpu_info.driver_version())
    packages = {}
    for name in (*NVRTC_PACKAGES, *NVJITLINK_PACKAGES):
      try:
        packages[name] = importlib.metadata.version(name)
      except importlib.metadata.PackageNotFoundError:
        pass
    return Toolchain((int(major), int(minor)), linker, int(driver.group(1)) if driver else None, packages)

  def package_of(self, names) -> str | None:
    return next((f"{name} {self.packages[name]}" for name in names if name in self.packages), None)


def _release(version: tuple[int, int]) -> str:
  return f"{version[0]}.{version[1]}"


def required() -> dict[str, str]:
  """{distribution: specifier} of this package's own requirements for NVRTC and nvJitLink ("==13.0.*")."""
  try:
    requirements = importlib.metadata.requires(_THIS_PACKAGE) or []
  except importlib.metadata.PackageNotFoundError:
    return {}
  out = {}
  for requirement in requirements:
    match = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*([=<>!~][^;]*)?(;.*)?$", requirement)
    if match and match.group(1).lower() in (*NVRTC_PACKAGES, *NVJITLINK_PACKAGES) and not match.group(3):
      out[match.group(1).lower()] = (match.group(2) or "").replace(" ", "")
  return out


def problems(toolchain: Toolchain, pins: dict[str, str] | None = None) -> list[str]:
  """What in ``toolchain`` cannot work together, each naming the packages and the command that fixes it;
  ``pins``: this package's requirements for them (`required`), which the command installs."""
  pins = required() if pins is None else pins
  out = []
  nvrtc_package = toolchain.package_of(NVRTC_PACKAGES) or "nvidia-cuda-nvrtc"
  linker_package = toolchain.package_of(NVJITLINK_PACKAGES) or "nvidia-nvjitlink"
  if toolchain.nvjitlink is not None and toolchain.nvrtc > toolchain.nvjitlink:
    nvrtc_pin = f"nvidia-cuda-nvrtc{pins.get('nvidia-cuda-nvrtc') or '==' + _release(toolchain.nvjitlink) + '.*'}"
    linker_pin = f"nvidia-nvjitlink{pins.get('nvidia-nvjitlink') or '==' + _release(toolchain.nvjitlink) + '.*'}"
    out.append(
        f"NVRTC {_release(toolchain.nvrtc)} ({nvrtc_package}) is newer than nvJitLink "
        f"{_release(toolchain.nvjitlink)} ({linker_package}): NVRTC writes PTX of its release, which nvJitLink's "
        f"ptxas cannot read (\"Unsupported .version\"), and nvJitLink builds every PDL-safe and NVSHMEM kernel. "
        f"Install one CUDA release of both, as jax_mosaic_ffi requires: pip install '{nvrtc_pin}' '{linker_pin}' "
        "(`pip check` names a package whose pin moved one of them)")
  newest = max(toolchain.nvrtc, toolchain.nvjitlink or toolchain.nvrtc)
  if toolchain.driver is not None and toolchain.driver // 1000 < newest[0]:
    out.append(
        f"the NVIDIA driver supports CUDA {toolchain.driver // 1000}.{toolchain.driver % 1000 // 10}, older than "
        f"the CUDA {newest[0]} of NVRTC {_release(toolchain.nvrtc)} ({nvrtc_package}) and nvJitLink "
        f"({linker_package}): the driver cannot load the kernels they build. Install a driver for CUDA {newest[0]} "
        f"(R580 or newer for CUDA 13), or run where there is one")
  return out


@functools.cache
def _checked() -> tuple[str, ...]:
  try:
    found = problems(Toolchain.installed())
  except Exception:  # noqa: BLE001  (NVRTC not loadable: its own error comes with the compile)
    return ()
  for problem in found:
    source_location.warn(f"jax_mosaic_ffi: {problem}", RuntimeWarning)
  return tuple(found)


def check() -> tuple[str, ...]:
  """The toolchain's problems, worked out (and each warned of, at the user's line, as a RuntimeWarning) at the
  first compile of the process."""
  return _checked()


def advice() -> str | None:
  """The toolchain's problems, as the advice of a compile that failed; None where it has none."""
  return "; and ".join(_checked()) or None
