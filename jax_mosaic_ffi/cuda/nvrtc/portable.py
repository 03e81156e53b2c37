"""An NVRTC compile's cache entry as a kernel pack carries it to another machine (store/packs.py).

The entry lists the headers the compile read from disk by this machine's paths, with their sha256
(base/file_deps.py). In a pack, those under this package's ``include/`` and the CUDA include folders (the wheels'
or the toolkit's) are written relative to them (``<jmf>/...``, ``<cuda:...>/...``), as installs put them anywhere;
on the machine that loads the pack they are found in its own folders again and must hash as they did (an
install with other CUDA headers would compile another kernel: the entry does not apply, and the kernel compiles,
or is an error in the strict mode). A header of the user's (an ``-I`` folder) that is there must be as it was; one
that is not there is taken as the pack recorded it: a deployment ships the pack, not the sources. A path the include
search tried before a header and found empty must still be empty where it is named.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath

from jax_mosaic_ffi.base import file_deps
from jax_mosaic_ffi.base.paths import DEVICE_INCLUDE_DIR
from jax_mosaic_ffi.store.compile_cache import Portable
from jax_mosaic_ffi.toolchain.compiled import Compiled
from jax_mosaic_ffi.cuda.nvrtc import compat

_PACKAGE = "<jmf>"


def _folders() -> dict[str, str]:
  """This machine's include folders by their portable names: ``<jmf>`` for this package's, ``<cuda:...>`` for each
  CUDA one, named by its path below ``site-packages`` (a wheel's: the same on every machine with that wheel), else
  by its whole path (a toolkit's, /usr/local/cuda/include)."""
  found = {_PACKAGE: os.path.abspath(DEVICE_INCLUDE_DIR)}
  for folder in compat.cuda_include_dirs():
    full = os.path.abspath(folder)
    _, marker, tail = full.replace(os.sep, "/").rpartition("/site-packages/")
    found[f"<cuda:{'site-packages/' + tail if marker else full}>"] = full
  return found


def _under(path: str, folder: str) -> str | None:
  """``path`` relative to ``folder`` (as a POSIX path), or None where it is not below it."""
  folder = os.path.join(folder, "")
  full = os.path.abspath(path)
  return full[len(folder):].replace(os.sep, "/") if full.startswith(folder) else None


def encode(compiled: Compiled) -> bytes:
  # The most specific folder a path is below names it (CCCL's folder is inside the CUDA headers' own).
  folders = sorted(_folders().items(), key=lambda item: -len(item[1]))
  deps = []
  for path, value in compiled.deps:
    named = next(((name, r) for name, folder in folders if (r := _under(path, folder)) is not None), None)
    deps.append((f"{named[0]}/{named[1]}", value) if named else (path, value))
  return dataclasses.replace(compiled, deps=tuple(deps)).to_bytes()


def decode(data: bytes) -> Compiled:
  """The entry with its headers found here; raises ValueError naming one that differs."""
  compiled = Compiled.from_bytes(data)
  folders = _folders()
  deps = []
  for path, value in compiled.deps:
    if path.startswith("<"):
      name, _, relative = path.partition(">/")
      name += ">"
      if posixpath.normpath(relative) != relative or relative.startswith("../") or posixpath.isabs(relative):
        raise ValueError(f"its header path {path!r} is not a relative path below its folder")
      what = "this package's" if name == _PACKAGE else f"the CUDA ({name[6:-1]})"
      if name not in folders:
        if value is None:
          continue  # a path that was tried and empty, in a folder this machine does not have
        raise ValueError(f"{what} header {relative} is not here (its folder is not): the kernel was compiled against "
                         "another install; record the pack with the CUDA packages you deploy")
      local = os.path.join(folders[name], *relative.split("/"))
      if file_deps.digest(local) != value:
        state = "is there" if value is None else "differs here" if os.path.exists(local) else "is not here"
        raise ValueError(f"{what} header {relative} {state}: the kernel was compiled against another install; record "
                         "the pack with the releases you deploy")
      deps.append((local, value))
    elif value is None:
      if file_deps.digest(path) is not None:
        raise ValueError(f"{path} is here, and the compile found no header there (it would shadow one)")
      deps.append((path, value))
    elif os.path.exists(path):
      if file_deps.digest(path) != value:
        raise ValueError(f"the header {path} differs here from the one the kernel was compiled with")
      deps.append((path, value))
    # else: a header of the user's that is not here: taken as the pack recorded it.
  return dataclasses.replace(compiled, deps=tuple(deps))


PORTABLE = Portable(encode=encode, decode=decode)
