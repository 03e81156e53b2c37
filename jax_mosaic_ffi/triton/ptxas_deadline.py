"""Triton's ptxas under a compile's deadline: `bounded`.

Triton compiles in this process (its compiler holds the kernel's Python objects), where nothing stops a stage once
it started; its last stage runs ptxas, a subprocess, and that is where a compile of huge blocks spends minutes. For
one compile at a time (compile.py holds its lock), `bounded(deadline)` points Triton's ptxas knobs at a wrapper of
ours, inside the knobs' own scope, which restores them (and the ``TRITON_PTXAS*_PATH`` variables a knob sets) after.
Both knobs, ``knobs.nvidia.ptxas`` and ``ptxas_blackwell``, are set, each to a wrapper of the ptxas it named: which
one an arch uses changed between Triton 3.6 and 3.9. The wrapper (ptxas_program.py) runs that real ptxas with the
time left until the deadline, kills it past it, and starts none once the deadline has passed: the deadline covers
the whole compile, Triton's own stages (which cannot be stopped) included.

What the wrapper did is read back after the compile: `Ptxas.stopped` says "killed" (ptxas ran until the deadline)
or "not started" (Triton's stages took the whole bound), so the error says which part was slow.

Where the files live: a folder of this process's own, made by ``tempfile.mkdtemp`` (mode 0700, in TMPDIR), which
holds one shell script per real ptxas (it ``exec``s this Python, ``-I -S``, on ptxas_program.py with the real path)
and the deadline file; nobody else can write or replace them, and the folder goes at exit. A child made by
``os.fork`` makes its own at its first compile and leaves its parent's alone. Triton caches each path's
``--version`` (``NvidiaTool.from_path``), so a script keeps its path for the process's life.

``--version`` goes through to the real ptxas unchanged (compared when a script is made), so Triton's cache key,
which holds ptxas' version and not its path, is the same with the wrapper as without it. Where a script cannot run
(TMPDIR mounted noexec) a RuntimeWarning says so, once, and Triton's compiles run unbounded.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.triton import ptxas_program

# Triton's knobs for its ptxas binaries (knobs.nvidia), each set where the installed Triton has it.
KNOBS = ("ptxas", "ptxas_blackwell")
PROGRAM = ptxas_program.__file__  # run as a script in the wrapper's process
_SCRIPT = '#!/bin/sh\nexec {python} -I -S {program} {real} {deadline} "$@"\n'
_VERSION_TIMEOUT_S = 60


class _Folder:
  """This process's folder of wrappers (used under compile.py's lock only)."""

  def __init__(self):
    self.path: str | None = None
    self.owner: int | None = None
    self.scripts: dict[str, str | None] = {}  # real ptxas -> its wrapper, or None where none can run
    self.made = 0  # scripts made: each its own name (Triton caches a path's --version for the process's life)
    self.warned = False

  def ready(self) -> str:
    if self.path is None or self.owner != os.getpid() or not os.path.isdir(self.path):
      self.path, self.owner, self.scripts = tempfile.mkdtemp(prefix="jmf-ptxas-"), os.getpid(), {}
    return self.path

  @property
  def deadline_file(self) -> str:
    return os.path.join(self.path, "deadline")

  def set_deadline(self, deadline: float) -> None:
    self.take_stopped()
    temporary = self.deadline_file + ".new"
    with open(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
      f.write(repr(deadline))
    os.replace(temporary, self.deadline_file)

  def take_stopped(self) -> str | None:
    """What the wrapper wrote when it stopped a ptxas since the deadline was set ("killed", "not started")."""
    try:
      with open(self.deadline_file + ".stopped") as f:
        stopped = f.read().strip()
      os.remove(self.deadline_file + ".stopped")
    except OSError:
      return None
    return stopped or None

  def script(self, real: str) -> str | None:
    """The wrapper of the ptxas at ``real``, made the first time; None (and a warning, once) where it cannot run."""
    if real in self.scripts and (self.scripts[real] is None or os.path.exists(self.scripts[real])):
      return self.scripts[real]
    path = os.path.join(self.path, f"ptxas-{self.made}")
    self.made += 1
    text = _SCRIPT.format(python=shlex.quote(sys.executable), program=shlex.quote(PROGRAM),
                          real=shlex.quote(real), deadline=shlex.quote(self.deadline_file))
    try:
      with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700), "w") as f:
        f.write(text)
    except OSError as e:
      problem = f"could not be written ({e})"
    else:
      problem = _version_differs(path, real)
    self.scripts[real] = None if problem else path
    if problem and not self.warned:
      self.warned = True
      source_location.warn(
          f"jax_mosaic_ffi: Triton's compiles run without the JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S bound in this "
          f"process: the ptxas wrapper in {self.path} {problem}. Point TMPDIR at a folder where programs may run",
          RuntimeWarning)
    return self.scripts[real]

  def remove(self) -> None:
    if self.path is not None and self.owner == os.getpid():
      shutil.rmtree(self.path, ignore_errors=True)
      self.path = None


def _version_differs(wrapper: str, real: str) -> str | None:
  """None where the wrapper answers ``--version`` as the real ptxas does; else what went wrong."""
  try:
    answers = [subprocess.run([tool, "--version"], capture_output=True, timeout=_VERSION_TIMEOUT_S, check=True).stdout
               for tool in (real, wrapper)]
  except (OSError, subprocess.SubprocessError) as e:
    return f"could not run ({type(e).__name__}: {e})"
  return None if answers[0] == answers[1] else "answers --version otherwise than ptxas"


_folder = _Folder()
atexit.register(_folder.remove)


class Ptxas:
  """What `bounded` yields: after the block, ``stopped`` is "killed" or "not started" where the wrapper stopped a
  ptxas at the deadline, else None."""

  stopped: str | None = None


@contextlib.contextmanager
def bounded(deadline: float | None):
  """Triton's compiles inside run ptxas stopped at ``deadline`` (a ``time.monotonic()`` value); None: unbounded.
  Yields a `Ptxas`. Under compile.py's lock: the knobs are the process's."""
  ptxas = Ptxas()
  if deadline is None:
    yield ptxas
    return
  from triton import knobs  # noqa: PLC0415  (optional dependency: Triton)
  try:
    folder = _folder.ready()
    _folder.set_deadline(deadline)
  except OSError as e:
    source_location.warn(f"jax_mosaic_ffi: this Triton compile runs without the JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S "
                         f"bound: no folder for the ptxas wrapper ({e}). Point TMPDIR at a writable folder",
                         RuntimeWarning)
    yield ptxas
    return
  with knobs.nvidia.scope():
    for name in KNOBS:
      if name not in knobs.nvidia.knob_descriptors:
        continue
      try:
        real = getattr(knobs.nvidia, name).path
      except RuntimeError:  # Triton finds no such ptxas: its compile says so where it needs one
        continue
      if os.path.dirname(real) == folder:  # already ours
        continue
      wrapper = _folder.script(real)
      if wrapper is not None:
        setattr(knobs.nvidia, name, wrapper)
    try:
      yield ptxas
    finally:
      ptxas.stopped = _folder.take_stopped()
