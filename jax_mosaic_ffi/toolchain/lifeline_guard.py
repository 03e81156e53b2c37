"""The guard program of toolchain/lifeline.py: one per calling process, in a session of its own, reading on its
standard input what its caller tells it, until the caller ends; then it kills every process group its caller's
compiles still run in and removes every scratch folder they still have.

Run as ``python -I -S lifeline_guard.py`` with the caller's end of a socket pair as its standard input: this file
imports nothing but the standard library, so it starts in milliseconds. Its input is a stream of records, each
ended by a NUL byte (no path holds one): ``+g<group>`` and ``-g<group>`` (a process group to kill when the caller
ends, and one no longer to), ``+f<folder>`` and ``-f<folder>`` (the same for a scratch folder). Only the caller
holds the other end, and the kernel closes it when the caller ends, however it ends (SIGKILL, ``os._exit``): the
read then sees the end of the stream.

What it is told is bounded before it is used: a record longer than `MAX_RECORD_BYTES` is dropped, a group must be a
number above 1, not the guard's own and not its caller's, a folder an absolute path. A folder is removed only where
it is a folder (not a symlink to one) owned by this user; shutil.rmtree follows no symlink inside it.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import stat
import time

# A folder's path is at most PATH_MAX (4096) bytes; anything longer is not a record of our caller's.
MAX_RECORD_BYTES = 8192
# How long the guard waits for killed groups' processes to be gone before it removes their scratch (none runs
# after SIGKILL; a zombie no one reaps stays a member of its group, hence a bound).
GONE_WAIT_S = 10.0


class Told:
  """What the caller has told so far: its live groups and folders."""

  def __init__(self, caller_group: int) -> None:
    self.caller_group = caller_group  # never killed: the caller's own (its shell's, its terminal's)
    self.groups: set[int] = set()
    self.folders: set[str] = set()
    self._pending = b""

  def take(self, data: bytes) -> None:
    """Applies the complete records in ``data`` (with what an earlier read left unfinished)."""
    *records, self._pending = (self._pending + data).split(b"\0")
    if len(self._pending) > MAX_RECORD_BYTES:
      self._pending = b""  # dropped; the rest of it (up to its NUL) is dropped as a malformed record
    for record in records:
      if len(record) <= MAX_RECORD_BYTES:
        self._apply(record)

  def _apply(self, record: bytes) -> None:
    op, value = record[:2], record[2:]
    if op in (b"+g", b"-g"):
      if not (value.isdigit() and len(value) <= 10):
        return
      group = int(value)
      if group <= 1 or group in (os.getpgrp(), self.caller_group):
        return
      (self.groups.add if op == b"+g" else self.groups.discard)(group)
    elif op in (b"+f", b"-f"):
      folder = os.fsdecode(value)
      if os.path.isabs(folder):
        (self.folders.add if op == b"+f" else self.folders.discard)(folder)


def kill_groups(groups: set[int]) -> None:
  """SIGKILL to every group, again until none has a process left (or `GONE_WAIT_S`)."""
  deadline = time.monotonic() + GONE_WAIT_S
  live = set(groups)
  while live and time.monotonic() < deadline:
    for group in list(live):
      try:
        os.killpg(group, signal.SIGKILL)
      except (ProcessLookupError, PermissionError):
        live.discard(group)
    if live:
      select.select([], [], [], 0.02)


def remove_own_folder(folder: str) -> None:
  """Removes ``folder`` where it is a folder of this user's (not a symlink); else leaves it."""
  try:
    st = os.lstat(folder)
  except OSError:
    return
  if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
    shutil.rmtree(folder, ignore_errors=True)  # refuses a symlink put in its place meanwhile, follows none inside


def guard(fd: int = 0) -> None:
  """Reads ``fd`` until its end, then kills what is live and removes what is left. Never returns."""
  try:
    caller_group = os.getpgid(os.getppid())
  except OSError:  # the caller is gone already: what it told is all there is
    caller_group = -1
  told = Told(caller_group)
  try:
    while True:
      try:
        data = os.read(fd, 1 << 16)
      except InterruptedError:
        continue
      except OSError:
        break
      if not data:
        break
      told.take(data)
    kill_groups(told.groups)
    for folder in told.folders:
      remove_own_folder(folder)
  finally:
    os._exit(0)


if __name__ == "__main__":
  with contextlib.suppress(OSError):
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))  # none is ours; the caller closed what it could before the start
  guard()
