"""Running a test script in a fresh Python process, the one way the suite does it.

Fresh processes are for what one process cannot show: XLA flags read once at
start-up, caches across processes, a CUDA context broken by a device fault,
a process that must survive a hostile artifact, processes that run together
under jax.distributed (`run_together`). The script prints its findings as
one JSON object on its last line of output.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

TESTS = os.path.dirname(os.path.abspath(__file__))
_private_folder: str | None = None

# How long a child may run before the test calls it hung, kills it and fails: a hang guard, never a measure of
# speed, and the one every child of the suite gets (fresh processes, subprocesses, the processes run together).
# An hour: far above the slowest child on the slowest machine (the release wheel's build, about 10 minutes on 2
# shared cores; a few minutes more under a competing load), so that no outcome depends on the machine's speed or
# load. A test whose subject is time measures it relatively instead (a ratio, or an outcome only a deadline gives).
HANG_GUARD_S = 3600.0
# The same for a wait inside a child (for a peer, a forked grandchild): below the child's own guard, so that the
# child reports the hang itself.
INNER_GUARD_S = HANG_GUARD_S / 4


def private_folder() -> str:
  """An empty folder of this test session's own, where children run by default: `python -c` puts its
  working directory first on sys.path, so a shared one (the temporary folder, where other runs leave files)
  could shadow any import, and a source checkout there the installed package."""
  global _private_folder
  if _private_folder is None:
    _private_folder = tempfile.mkdtemp(prefix="jmf-test-children-")
    atexit.register(shutil.rmtree, _private_folder, True)
  return _private_folder


@dataclasses.dataclass
class Finished:
  returncode: int
  stdout: str
  stderr: str

  @property
  def result(self):
    """The JSON object on the last line of stdout."""
    lines = [line for line in self.stdout.strip().splitlines() if line.strip()]
    if not lines:
      raise AssertionError(f"the child printed nothing; stderr:\n{self.stderr[-3000:]}")
    return json.loads(lines[-1])


def start(script: str, *args, env: dict | None = None, cwd=None) -> subprocess.Popen:
  """Starts ``script`` (dedented) with ``args`` in a new interpreter that can import tests/ helpers.

  ``env`` is added to the current environment. For children that must run
  at the same time; `finish` waits for one. Without ``cwd`` the child runs
  in `private_folder()`.
  """
  environment = {**os.environ, **(env or {})}
  environment["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, environment.get("PYTHONPATH", "")) if p)
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], env=environment,
                          cwd=cwd if cwd is not None else private_folder(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = HANG_GUARD_S, check: bool = True) -> Finished:
  """Waits for a started child; with ``check``, a non-zero exit fails the test with its stderr."""
  try:
    stdout, stderr = process.communicate(timeout=timeout)
  except subprocess.TimeoutExpired:
    process.kill()
    stdout, stderr = process.communicate()
    raise AssertionError(f"the child process ran over {timeout} s:\n{stderr[-4000:]}") from None
  finished = Finished(process.returncode, stdout, stderr)
  if check and process.returncode != 0:
    raise AssertionError(f"the child process failed with exit code {process.returncode}:\n{stderr[-4000:]}")
  return finished


def run(script: str, *args, env: dict | None = None, cwd=None, timeout: float = HANG_GUARD_S,
        check: bool = True) -> Finished:
  """`start` then `finish`: the usual way."""
  return finish(start(script, *args, env=env, cwd=cwd), timeout=timeout, check=check)


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now (another process may take it before the
  coordinator does: `run_together` starts again on another port when that happened)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# What a coordinator says when its port was taken between free_port() and its start.
_PORT_TAKEN = ("address already in use", "failed to add port", "failed to bind")


def run_together(*args, script: str, nprocs: int = 2, env: dict | None = None,
                 timeout: float = HANG_GUARD_S) -> list[Finished]:
  """Runs the script file ``script`` as ``nprocs`` processes at once, each with arguments
  ``rank nprocs port *args`` (a free port for jax.distributed's coordinator); returns each
  one's outcome, by rank. All are killed when one runs over ``timeout``, so a hang fails
  the test instead of stalling the suite. A port another process took first means another
  try on another port (at most three)."""
  for attempt in range(3):
    finished = _run_together_once(args, script, nprocs, env, timeout)
    if attempt == 2 or not any(marker in f.stderr.lower() for f in finished for marker in _PORT_TAKEN):
      return finished
  return finished


def _run_together_once(args, script: str, nprocs: int, env: dict | None, timeout: float) -> list[Finished]:
  port = free_port()
  environment = {**os.environ, **(env or {})}
  environment["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, environment.get("PYTHONPATH", "")) if p)
  # Output goes to files, so a chatty process never blocks on a pipe we are not reading yet.
  files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(nprocs)]
  processes = [subprocess.Popen([sys.executable, script, str(rank), str(nprocs), str(port), *map(str, args)],
                                env=environment, cwd=private_folder(), stdout=files[rank][0],
                                stderr=files[rank][1], text=True) for rank in range(nprocs)]
  deadline = time.monotonic() + timeout
  try:
    for p in processes:
      try:
        p.wait(timeout=max(0.1, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        raise AssertionError(f"a process ran over {timeout} s (args {args}); stderr of rank 0:\n"
                             f"{_read(files[0][1])[-3000:]}") from None
  finally:
    for p in processes:
      if p.poll() is None:
        p.kill()
        p.wait()
  return [Finished(p.returncode, _read(out), _read(err)) for p, (out, err) in zip(processes, files)]


def _read(f) -> str:
  f.seek(0)
  text = f.read()
  return text


def running(marker: str) -> list[str]:
  """The processes whose command line holds ``marker`` (zombies have none): what a test of a killed child
  checks is gone."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if marker.encode() in f.read():
          found.append(pid)
    except OSError:
      pass
  return found
