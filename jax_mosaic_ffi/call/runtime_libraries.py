"""The native libraries the runtime opens for images of some kinds (`RuntimeLibrary`), published at registration.

A front end's images may run through a library that is not ours (CuTe DSL objects: NVIDIA's runtime library,
opened from the user's install). The runtime opens it at the instantiate of a call whose module holds such
images; in a process that only deserializes a jax.export artifact no lowering of ours comes before that, so
registering the targets (registration.py, at the first lowering of any program) tells the runtime where each
installed front end's libraries are. A library that cannot be found (a damaged optional install) stops only the
kernels whose images need it: the failure is kept (an install does not mend itself within a process), told to the
runtime for those calls' instantiate, and raised at each lowering of such a kernel (`check`).
"""

from __future__ import annotations

import threading

from jax_mosaic_ffi.base.module_format import ParsedModule
from jax_mosaic_ffi.call import front_end

_lock = threading.Lock()
# Why each library that could not be found was not, by its name: kept for the process.
_problems: dict[str, str] = {}


def _libraries():
  return [library for end in front_end.installed() for library in end.runtime_libraries]


def publish() -> None:
  """Tells the runtime where each installed front end's libraries are; a failure is kept, per library, and
  concerns its kernels alone: the targets are registered for every other kernel."""
  for library in _libraries():
    if library.name in _problems:
      continue
    try:
      library.publish()
    except Exception as e:  # a damaged optional install: kept for the kernels that need the library
      message = (f"jax_mosaic_ffi could not find {library.description}: {type(e).__name__}: {e}. {library.kernels} "
                 f"cannot run in this process (every other kernel can): {library.remedy}, then start a new process")
      with _lock:
        if library.name not in _problems:
          _problems[library.name] = message
          library.refuse(message)


def check(module: ParsedModule, where: str) -> None:
  """Raises the library's `unavailable` error at the lowering of a kernel (after registration) whose images need
  a library that could not be found, naming ``where`` (the call site and kernel) and the kept cause."""
  if not _problems:  # every lowering asks
    return
  kinds = {image.kind for image in module.images}
  for library in _libraries():
    if library.name in _problems and kinds.intersection(library.image_kinds):
      raise library.unavailable(f"{where}: {_problems[library.name]}")


def problems() -> dict[str, str | None]:
  """Each installed front end's library by name: None, or why it could not be found."""
  return {library.name: _problems.get(library.name) for library in _libraries()}
