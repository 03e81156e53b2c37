"""An installed file's identity from its wheel's RECORD: the distribution, its release and the sha256 the wheel
lists for the file. The same on every machine with that wheel, wherever it is installed, and read from the
installed metadata in about a millisecond (nothing loaded, nothing hashed): what compile keys name a toolchain's
library by (NVRTC's, NVSHMEM's device library), so that a kernel pack's keys are those of the machine that loads it.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
from typing import Sequence


def identity(path: str | pathlib.Path, distributions: Sequence[str]) -> str | None:
  """``"<distribution> <release> <file> sha256=<hash>"`` for the first of ``distributions`` that installed ``path``
  with a hash in its RECORD, or None (not installed by any of them: the caller names it otherwise)."""
  try:
    wanted = pathlib.Path(path).resolve()
  except OSError:
    return None
  for name in distributions:
    try:
      dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
      continue
    for file in dist.files or ():
      if file.hash is None or file.name != wanted.name:
        continue
      try:
        if pathlib.Path(dist.locate_file(file)).resolve() == wanted:
          return f"{dist.metadata['Name']} {dist.version} {file.as_posix()} {file.hash.mode}={file.hash.value}"
      except OSError:
        continue
  return None
