"""Where CuTe DSL is installed: the ``nvidia-cutlass-dsl`` wheels (``pip install 'jax_mosaic_ffi[cute]'``).

A CuTe DSL kernel is compiled by the DSL (its Python package, ``cutlass``) into an object that NVIDIA's runtime
library, ``libcute_dsl_runtime.so`` in the DSL's cu13 libraries, loads and runs. The library is under NVIDIA's
EULA: nothing of it is linked into or shipped with the extension, which opens the user's copy at run time
(csrc/driver/cute_dsl_runtime.h). This module finds it and names its release without importing the DSL (which
loads MLIR and takes a second): a process that only runs exported programs needs the library, not the compiler.
It tells the runtime where the library is (`publish`) when the targets are registered (the wing's front_end.py
names it as this wing's `RuntimeLibrary`, call/runtime_libraries.py).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import os
import pathlib

from jax_mosaic_ffi.base.native import core

INSTALL_HINT = "pip install 'jax_mosaic_ffi[cute]' (nvidia-cutlass-dsl with its cu13 libraries)"
# What to do where finding the runtime library failed (call/runtime_libraries.py says it, then "start a new process").
REMEDY = f"reinstall nvidia-cutlass-dsl in the supported range (docs/compatibility.md; {INSTALL_HINT})"
# The CUDA flavour of the DSL's libraries that matches this package's CUDA 13 stack.
FLAVOR = "cu13"
LIBRARY = "libcute_dsl_runtime.so"


class CuteUnavailable(ImportError):
  """The CuTe DSL (nvidia-cutlass-dsl) is missing, of an unsupported release or damaged.

  Raised by `cute_kernel` and `cute_call`, and by a CuTe DSL call's lowering where its runtime library could not
  be found. ``pip install 'jax_mosaic_ffi[cute]'`` installs a supported release.
  """


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


# The distribution that ships the library, and the library's path in its file list (its RECORD).
DISTRIBUTION = f"nvidia-cutlass-dsl-libs-{FLAVOR}"
_LIBRARY_FILE = f"nvidia_cutlass_dsl/{FLAVOR}/lib/{LIBRARY}"


def _untrusted_folders() -> set[pathlib.Path]:
  """Folders of sys.path that are not installations: the working directory (``python -c``, ``-m`` and the REPL
  put it first) and PYTHONPATH's entries. A file there is whoever wrote it last; the library is native code that
  runs in this process."""
  entries = [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
  return {pathlib.Path(e or os.getcwd()).resolve() for e in entries}


def _installations():
  """(folder, distribution) of each install of the library's distribution on sys.path, in its order."""
  for distribution in importlib.metadata.distributions(name=DISTRIBUTION):
    try:
      yield pathlib.Path(distribution.locate_file("")).resolve(), distribution
    except (OSError, TypeError, NotImplementedError):  # not a distribution of files
      continue


@functools.cache
def runtime() -> CuteRuntime | None:
  """The installed runtime library, or None where nvidia-cutlass-dsl's cu13 libraries are missing.

  Found in the file list of the distribution that ships it (nvidia-cutlass-dsl-libs-cu13), at the path its
  installer wrote, in the first such distribution on sys.path outside the working directory and PYTHONPATH;
  never by looking up the package ``nvidia_cutlass_dsl``: it is a namespace package, whose portions come from
  every folder on sys.path, so a ``nvidia_cutlass_dsl/cu13/lib/libcute_dsl_runtime.so`` planted in the working
  directory or on PYTHONPATH would be found first, and loaded by a process that only runs exported programs."""
  untrusted = _untrusted_folders()
  for where, distribution in _installations():
    if where in untrusted:
      continue
    for file in distribution.files or ():
      if file.as_posix() == _LIBRARY_FILE:
        library = pathlib.Path(distribution.locate_file(file))
        if library.is_file():
          return CuteRuntime(library.resolve(), distribution.version)
    return None  # the installed distribution, without the library: damaged, nothing else is taken instead
  return None


@functools.cache
def compiler_release() -> str | None:
  """The release of the installed DSL compiler (nvidia-cutlass-dsl), or None without it (read once: every trace
  asks, and reading package metadata costs milliseconds)."""
  return _release("nvidia-cutlass-dsl")


def publish() -> None:
  """Tells the runtime where the library is (it opens it when a CuTe DSL call is first instantiated); nothing
  where nvidia-cutlass-dsl's cu13 libraries are not installed (a CuTe DSL kernel is then refused where it
  compiles, and a deserialized one at its instantiate). Raises where they are installed only in the working
  directory or on PYTHONPATH, naming the folder."""
  found = runtime()
  if found is not None:
    core.set_cute_dsl_runtime(str(found.library), found.release)
    return
  installs = [where for where, _ in _installations()]
  if installs and _untrusted_folders().issuperset(installs):  # only where it is not loaded from (runtime_libraries.py)
    raise RuntimeError(
        f"{DISTRIBUTION} is installed only in {', '.join(map(str, installs))}, the working directory or on "
        "PYTHONPATH, where jax_mosaic_ffi loads no native code (a file there is whoever wrote it last): install it "
        "into the environment (pip install), or name its folder in a .pth file of site-packages")


def refuse(message: str) -> None:
  """Tells the runtime why the library could not be found: a CuTe DSL call's instantiate reports it."""
  core.set_cute_dsl_runtime_problem(message)
