"""The ptxas our Triton compiles run: Triton's own ptxas, stopped at the compile's deadline.

Run as a script (the package imports it only for its path; the standard library only)::

    python -I -S ptxas_program.py REAL_PTXAS DEADLINE_FILE ARGS...

by the shell wrapper that ptxas_deadline.py points Triton's ptxas knobs at for the length of one compile.
``--version`` alone (Triton's cache key and its PTX version read it) runs the real ptxas in its place, so the
answer is the same byte for byte. Anything else runs the real ptxas with the time left until the deadline, a
``time.monotonic()`` value in DEADLINE_FILE (CLOCK_MONOTONIC: one clock for every process of the machine), and
kills it there; with no time left it is not started. Either is written to DEADLINE_FILE.stopped ("killed" or "not
started") for the compile to say, and the wrapper exits 0 leaving no output file: Triton then fails opening the
cubin, where a failed ptxas would make it print the whole PTX to stdout, and the compile raises CompileTimeout.
This process and ptxas both die with their parent (PR_SET_PDEATHSIG): an interrupted compile leaves no ptxas
running.

Every compile runs ptxas through it, so it starts fast (about 20 ms over ptxas): modules written in C only (no
subprocess, no signal: 15 ms of imports), ptxas forked and awaited on a pidfd, which wakes the moment it ends.
"""

import os
import select
import sys
import time

_PR_SET_PDEATHSIG = 1
_SIGKILL = 9


def _die_with_parent(parent: int | None = None) -> None:
  """SIGKILL to this process when the thread that started it ends; where ``parent`` already ended, now."""
  try:
    import ctypes  # noqa: PLC0415  (only here: the --version path runs without it)
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, _SIGKILL, 0, 0, 0)
  except (ImportError, OSError, AttributeError):
    return
  if parent is not None and os.getppid() != parent:
    os._exit(1)


def _output(args: list[str]) -> str | None:
  for k, arg in enumerate(args[:-1]):
    if arg in ("-o", "--output-file"):
      return args[k + 1]
  return None


def _start(real: str, args: list[str]) -> int:
  """The real ptxas, started in a child that dies with this process."""
  parent = os.getpid()
  pid = os.fork()
  if pid == 0:
    try:
      _die_with_parent(parent)
      os.execv(real, [real, *args])
    except BaseException as e:  # noqa: BLE001  (the child must never return into the parent's code)
      os.write(2, f"jax_mosaic_ffi's ptxas wrapper could not run {real}: {e}\n".encode())
    finally:
      os._exit(127)
  return pid


def _ended_by(pid: int, deadline: float) -> int | None:
  """The child's wait status where it ends before ``deadline``, else None (it is still running)."""
  try:
    pidfd = os.pidfd_open(pid)
  except (AttributeError, OSError):  # no pidfd (Linux before 5.3): poll
    pidfd = None
  try:
    while True:
      done, status = os.waitpid(pid, os.WNOHANG)
      if done:
        return status
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        return None
      if pidfd is not None:
        select.select([pidfd], [], [], remaining)
      else:
        time.sleep(min(remaining, 0.005))
  finally:
    if pidfd is not None:
      os.close(pidfd)


def main(argv: list[str]) -> int:
  real, deadline_file, args = argv[1], argv[2], argv[3:]
  if args == ["--version"]:
    os.execv(real, [real, *args])
  _die_with_parent()
  try:
    with open(deadline_file) as f:
      deadline = float(f.read())
  except (OSError, ValueError) as e:
    print(f"jax_mosaic_ffi's ptxas wrapper: no deadline to run under ({e})", file=sys.stderr)
    return 1
  stopped = "not started"
  if deadline > time.monotonic():
    pid = _start(real, args)
    status = _ended_by(pid, deadline)
    if status is not None:
      code = os.waitstatus_to_exitcode(status)
      return code if code >= 0 else 128 - code  # killed by a signal: as a shell reports it
    os.kill(pid, _SIGKILL)
    os.waitpid(pid, 0)
    stopped = "killed"
  output = _output(args)
  if output is not None and os.path.exists(output):
    os.remove(output)
  with open(deadline_file + ".stopped", "w") as f:
    f.write(stopped)
  print(f"jax_mosaic_ffi: ptxas {stopped} at the compile's deadline (JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S)",
        file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
