"""Running a test script in a fresh Python process, the one way the suite does it.

Fresh processes are for what one process cannot show: XLA flags read once at
start-up, caches across processes, a CUDA context broken by a device fault,
a process that must survive a hostile artifact, processes that run together
under jax.distributed (`run_together`). The script prints its findings as
one JSON object on its last line of output.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
import time

TESTS = os.path.dirname(os.path.abspath(__file__))


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
  in the temporary folder: `python -c` puts its folder first on sys.path, and
  a source checkout there would shadow the installed package.
  """
  environment = {**os.environ, **(env or {})}
  environment["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, environment.get("PYTHONPATH", "")) if p)
  return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *map(str, args)], env=environment,
                          cwd=cwd if cwd is not None else tempfile.gettempdir(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen, timeout: float = 300, check: bool = True) -> Finished:
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


def run(script: str, *args, env: dict | None = None, cwd=None, timeout: float = 300, check: bool = True) -> Finished:
  """`start` then `finish`: the usual way."""
  return finish(start(script, *args, env=env, cwd=cwd), timeout=timeout, check=check)


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on right now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_together(*args, script: str, nprocs: int = 2, env: dict | None = None,
                 timeout: float = 180) -> list[Finished]:
  """Runs the script file ``script`` as ``nprocs`` processes at once, each with arguments
  ``rank nprocs port *args`` (a free port for jax.distributed's coordinator); returns each
  one's outcome, by rank. All are killed when one runs over ``timeout``, so a hang fails
  the test instead of stalling the suite."""
  port = free_port()
  environment = {**os.environ, **(env or {})}
  environment["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, environment.get("PYTHONPATH", "")) if p)
  # Output goes to files, so a chatty process never blocks on a pipe we are not reading yet.
  files = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(nprocs)]
  processes = [subprocess.Popen([sys.executable, script, str(rank), str(nprocs), str(port), *map(str, args)],
                                env=environment, cwd=tempfile.gettempdir(), stdout=files[rank][0],
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
