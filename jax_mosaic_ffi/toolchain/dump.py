"""Writing each kernel's PTX, cubins and SASS to a folder, for reading them.

Set ``JAX_MOSAIC_FFI_DUMP_DIR=/some/dir`` and every kernel made afterwards
(`cuda_kernel`, `ptx_kernel`, `cubin_kernel`) is written there as
``<name>-<hash8>.ptx``, ``<name>-<hash8>.sm_90.cubin`` and, when
``cuobjdump`` is on the PATH or under ``$CUDA_HOME/bin``,
``<name>-<hash8>.sm_90.sass``.

In ``<name>``, characters other than letters, digits, ``_``, ``.`` and ``-``
become ``_``, as does a leading ``-`` or ``.``. Each file is written anew and
renamed over its name, so a symlink already there is replaced, never written
through. The dump is a debugging aid: a folder that cannot be written warns
(once per folder) and kernels are made without it; a failing or hanging
``cuobjdump`` leaves a note in the ``.sass`` file.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import secrets
import shutil
import subprocess
import warnings

from jax_mosaic_ffi.base import flags
from jax_mosaic_ffi.base.module_format import ImageKind
from jax_mosaic_ffi.base.paths import PACKAGE_DIR

DUMP_ENV = flags.DUMP_DIR
_CUOBJDUMP_TIMEOUT_S = 60
_warned: set[str] = set()


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
  # Absolute, so no path handed to cuobjdump can start with '-'.
  folder = pathlib.Path(os.path.expanduser(directory)).absolute()
  written = []
  try:
    folder.mkdir(parents=True, exist_ok=True)
    stem = _stem(kernel)
    for image in kernel.images:
      if image.kind == ImageKind.PTX:
        written.append(_write(folder / f"{stem}.ptx", image.data))
        continue
      if image.kind == ImageKind.CUTE:  # an ELF object: the host launch function with the cubin inside
        written.append(_write(folder / f"{stem}.{image.arch.sm}.o", image.data))
        continue
      cubin = _write(folder / f"{stem}.{image.arch.sm}.cubin", image.data)
      written.append(cubin)
      tool = _cuobjdump()
      if tool:
        written.append(_write(folder / f"{stem}.{image.arch.sm}.sass", lambda fd: _disassemble(tool, cubin, fd)))
  except OSError as err:
    if str(folder) not in _warned:
      _warned.add(str(folder))
      warnings.warn(
          f"{DUMP_ENV}={directory!r}: cannot write kernel dumps there ({err}); kernels are made without "
          f"them. Point {DUMP_ENV} at a writable folder, or unset it.",
          RuntimeWarning, skip_file_prefixes=(PACKAGE_DIR + os.sep,))
  return written


def _stem(kernel) -> str:
  name = re.sub(r"[^A-Za-z0-9_.-]", "_", kernel.name)[:80]
  # A leading '-' reads as an option to cuobjdump and shell tools; a leading '.' hides the file.
  name = re.sub(r"^[-.]", "_", name) or "_"
  return f"{name}-{kernel.hash.hex()[:8]}"


def _write(path: pathlib.Path, content) -> pathlib.Path:
  """Writes `content` (bytes, or a function given the open fd) to a new file renamed over `path`."""
  temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
  fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
  try:
    with os.fdopen(fd, "wb") as f:
      if callable(content):
        content(f.fileno())
      else:
        f.write(content)
    # Replaces a symlink (or anything else) at `path` rather than writing through it.
    os.replace(temp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.unlink(temp)
    raise
  return path


def _disassemble(tool: str, cubin: pathlib.Path, fd: int) -> None:
  """Writes cuobjdump's SASS of `cubin` to `fd`; a failure is noted there, never raised."""
  # Straight to the file, so a huge listing never sits in memory; the timeout
  # bounds a tool that hangs.
  try:
    result = subprocess.run([tool, "--dump-sass", str(cubin)], stdin=subprocess.DEVNULL, stdout=fd,
                            stderr=subprocess.STDOUT, timeout=_CUOBJDUMP_TIMEOUT_S)
    problem = f"exited with status {result.returncode}" if result.returncode else None
  except subprocess.TimeoutExpired:
    problem = f"was stopped after {_CUOBJDUMP_TIMEOUT_S} s"
  except (OSError, subprocess.SubprocessError) as err:
    problem = f"could not run ({err})"
  if problem:
    os.write(fd, f"\n[jax_mosaic_ffi: {tool} {problem}]\n".encode())
