"""Writing each kernel's PTX, cubins and SASS to a folder, for reading them.

Set ``JAX_MOSAIC_FFI_DUMP_DIR=/some/dir`` and every kernel made afterwards
(`cuda_kernel`, `ptx_kernel`, `cubin_kernel`) is written there as
``<name>-<hash8>.ptx``, ``<name>-<hash8>.sm_90.cubin`` and, when
``cuobjdump`` is on the PATH or under ``$CUDA_HOME/bin``,
``<name>-<hash8>.sm_90.sass``.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

from jax_mosaic_ffi.module_format import ImageKind

DUMP_ENV = "JAX_MOSAIC_FFI_DUMP_DIR"


def _cuobjdump() -> str | None:
  found = shutil.which("cuobjdump")
  if found:
    return found
  for home in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
    if home and os.path.exists(os.path.join(home, "bin", "cuobjdump")):
      return os.path.join(home, "bin", "cuobjdump")
  return None


def maybe_dump(kernel) -> list[pathlib.Path]:
  """Dumps `kernel` when the dump folder is set; returns the files written."""
  directory = os.environ.get(DUMP_ENV)
  if not directory:
    return []
  folder = pathlib.Path(directory)
  folder.mkdir(parents=True, exist_ok=True)
  stem = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', kernel.name)[:80]}-{kernel.hash.hex()[:8]}"
  written = []
  for image in kernel.images:
    if image.kind == ImageKind.PTX:
      path = folder / f"{stem}.ptx"
      path.write_bytes(image.data)
      written.append(path)
      continue
    path = folder / f"{stem}.{image.arch.sm}.cubin"
    path.write_bytes(image.data)
    written.append(path)
    tool = _cuobjdump()
    if tool:
      result = subprocess.run([tool, "--dump-sass", str(path)], capture_output=True, text=True)
      sass = folder / f"{stem}.{image.arch.sm}.sass"
      sass.write_text(result.stdout if result.returncode == 0 else result.stderr)
      written.append(sass)
  return written
