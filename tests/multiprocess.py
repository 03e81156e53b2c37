"""Running a script as several jax.distributed processes at once, for cross-process tests.

Each process runs ``script`` with arguments ``rank nprocs port *args`` and
prints its findings as one JSON object on its last line of output (as with
fresh_process). All are killed when the first of them runs over the timeout,
so a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time

import fresh_process

TESTS = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(TESTS, "cross_process_worker.py")


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run(*args, nprocs: int = 2, env: dict | None = None, timeout: float = 180,
        script: str = WORKER) -> list[fresh_process.Finished]:
  """Runs ``script`` as ``nprocs`` processes; returns each one's outcome, by rank."""
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
  return [fresh_process.Finished(p.returncode, _read(out), _read(err)) for p, (out, err) in zip(processes, files)]


def _read(f) -> str:
  f.seek(0)
  text = f.read()
  return text


def results(finished: list[fresh_process.Finished]) -> list[dict]:
  """Each process's JSON result; a process that printed none fails with its stderr."""
  return [f.result for f in finished]
