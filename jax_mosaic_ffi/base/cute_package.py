"""Where CuTe DSL is installed: the ``nvidia-cutlass-dsl`` wheels (``pip install 'jax_mosaic_ffi[cute]'``).

A CuTe DSL kernel is compiled by the DSL (its Python package, ``cutlass``) into an object that NVIDIA's runtime
library, ``libcute_dsl_runtime.so`` in the DSL's cu13 libraries, loads and runs. The library is under NVIDIA's
EULA: nothing of it is linked into or shipped with the extension, which opens the user's copy at run time
(csrc/driver/cute_dsl_runtime.h). This module finds it and names its release without importing the DSL (which
loads MLIR and takes a second): a process that only runs exported programs needs the library, not the compiler.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
import pathlib

INSTALL_HINT = "pip install 'jax_mosaic_ffi[cute]' (nvidia-cutlass-dsl with its cu13 libraries)"
# The CUDA flavour of the DSL's libraries that matches this package's CUDA 13 stack.
FLAVOR = "cu13"
LIBRARY = "libcute_dsl_runtime.so"


@dataclasses.dataclass(frozen=True)
class CuteRuntime:
  """NVIDIA's CuTe DSL runtime library as installed: its path and its nvidia-cutlass-dsl release."""

  library: pathlib.Path
  release: str


def _release(*distributions: str) -> str | None:
  for name in distributions:
    try:
      return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      continue
  return None


@functools.cache
def runtime() -> CuteRuntime | None:
  """The installed runtime library, or None where nvidia-cutlass-dsl's cu13 libraries are missing."""
  try:
    spec = importlib.util.find_spec("nvidia_cutlass_dsl")
  except (ImportError, ValueError):
    return None
  folders = list(spec.submodule_search_locations or ()) if spec is not None else []
  for folder in folders:
    library = pathlib.Path(folder) / FLAVOR / "lib" / LIBRARY
    if library.is_file():
      release = _release(f"nvidia-cutlass-dsl-libs-{FLAVOR}", "nvidia-cutlass-dsl")
      if release is not None:
        return CuteRuntime(library.resolve(), release)
  return None


@functools.cache
def compiler_release() -> str | None:
  """The release of the installed DSL compiler (nvidia-cutlass-dsl), or None without it (read once: every trace
  asks, and reading package metadata costs milliseconds)."""
  return _release("nvidia-cutlass-dsl")
