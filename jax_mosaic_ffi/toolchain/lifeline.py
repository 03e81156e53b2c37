"""A compile that ends with its caller: a guard process that kills the compile's process group, and removes its
scratch folder, when the caller dies.

A bounded compile runs in a process of its own (a forked child, toolchain/forked_compile.py; NVRTC's worker,
cuda/nvrtc/worker.py), in a process group of its own with whatever it starts (ptxas). The caller kills that group
at the deadline or when it is interrupted; but a caller killed outright (SIGKILL, the OOM killer, ``os._exit``)
runs nothing, and Linux's parent-death signal reaches only the caller's own child (and only when the thread that
made it ends), not what that child started. So each such compile has a guard: a small process, in a session of its
own (a Ctrl-C at the terminal does not reach it), blocked on a pipe whose write end only the caller holds (the
lifeline). The kernel closes that end when the caller ends, in any way; the guard then kills the compile's group
and removes its scratch folder. A caller done with the compile ends the guard itself, then closes its end.

Run as a script it is such a guard (``python -S -P lifeline.py FD GROUP SCRATCH``): this file imports nothing but
the standard library, so the guard starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import sys
import time

# How long a guard waits for a killed group's processes to be gone before it removes their scratch (none runs
# after SIGKILL; a zombie no one reaps stays a member of its group, hence a bound).
_GONE_WAIT_S = 10.0

# The write ends this process holds: a child forked for a compile closes its copies (`forget_held`), so that a
# guard sees its caller end when the caller does, not when the last child forked from it does.
_held: set[int] = set()


class Lifeline:
  """The caller's end of a guard's pipe (the read end, ``fd``, is the guard's)."""

  def __init__(self) -> None:
    self.fd, self._write_end = os.pipe()  # neither is inherited by a program started with exec (O_CLOEXEC)
    _held.add(self._write_end)

  def guard(self, group: int, scratch: str | None) -> int:
    """Forks this process's guard of ``group`` (a forked compile's): returns its pid, for `end_guard`."""
    pid = os.fork()
    if pid == 0:
      try:
        os.setsid()
        os.closerange(0, self.fd)
        os.closerange(self.fd + 1, os.sysconf("SC_OPEN_MAX"))
      finally:
        watch(self.fd, group, scratch)  # never returns
    self._close_read_end()
    return pid

  def started(self) -> None:
    """The guard program holds its own copy of the read end now."""
    self._close_read_end()

  def close(self) -> None:
    """Closes the caller's end (after its guard was ended: else the guard takes it as the caller's end)."""
    self._close_read_end()
    write_end, self._write_end = self._write_end, None
    if write_end is not None:
      _held.discard(write_end)
      os.close(write_end)

  def _close_read_end(self) -> None:
    fd, self.fd = self.fd, None
    if fd is not None:
      os.close(fd)


def forget_held() -> None:
  """In a child made by os.fork: closes its copies of its parent's lifelines (they are the parent's alone)."""
  for fd in list(_held):
    with contextlib.suppress(OSError):
      os.close(fd)
  _held.clear()


os.register_at_fork(after_in_child=forget_held)


def end_guard(pid: int) -> None:
  """Ends a forked guard whose compile is over, and reaps it (a guard program: its Popen's kill and wait)."""
  with contextlib.suppress(OSError):
    os.kill(pid, signal.SIGKILL)
  with contextlib.suppress(ChildProcessError):
    os.waitpid(pid, 0)


def guard_command(fd: int, group: int, scratch: str | None) -> list[str]:
  """The command that runs a guard as a program of its own (for a compile started as a program)."""
  return [sys.executable, "-S", "-P", os.path.abspath(__file__), str(fd), str(group), scratch or ""]


def watch(fd: int, group: int, scratch: str | None) -> None:
  """The guard: blocks until the caller's end of ``fd`` closes (nothing is ever written to it); then kills the
  process group ``group`` and removes ``scratch``. Never returns."""
  try:
    with contextlib.suppress(OSError):
      os.read(fd, 1)
    _kill_group(group)
    if scratch:
      shutil.rmtree(scratch, ignore_errors=True)
  finally:
    os._exit(0)


def _kill_group(group: int) -> None:
  deadline = time.monotonic() + _GONE_WAIT_S
  while time.monotonic() < deadline:
    try:
      os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      return
    select.select([], [], [], 0.02)


if __name__ == "__main__":
  watch(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] or None)
