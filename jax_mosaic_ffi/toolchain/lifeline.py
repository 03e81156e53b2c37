"""Compiles that end with their caller: one guard per process that kills the process groups its compiles run in,
and removes their scratch folders, when the caller dies; and a sweep of the scratch a caller left when it died with
its guard.

A bounded compile runs in a process of its own (a forked child, toolchain/forked_compile.py; NVRTC's worker,
cuda/nvrtc/worker.py), in a process group of its own with whatever it starts (ptxas). The caller kills that group
at the deadline or when it is interrupted; but a caller killed outright (SIGKILL, the OOM killer, ``os._exit``)
runs nothing, and Linux's parent-death signal reaches only the caller's own child (and only when the thread that
made it ends), not what that child started. So each process that compiles has a guard (toolchain/lifeline_guard.py):
a small program started once, at the first bounded compile (and again in a child made by os.fork, whose guard is
its own), in a session of its own (a Ctrl-C at the terminal does not reach it), reading a socket whose other end
only this process holds. This process tells it each compile's group (`watch_group`) and scratch folder
(`scratch_folder`) before the compile can start anything, and that they are done (`forget_group`,
`remove_folder`) when they are; the kernel closes this process's end when it ends, in any way, and the guard then
kills every group still live and removes every folder still listed.

A guard started as a program costs its start once per process, off the compile's path (it starts while the compile
runs); a guard forked per compile cost a fork of this process, with everything it has loaded, each time.

A caller killed together with its guard (a whole session killed, a container stopped) leaves its scratch folders:
their names record their owner (its pid and start time), so a later process removes those whose owner is gone
(`sweep`), only folders owned by this user, never through a symlink.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import threading

from jax_mosaic_ffi.toolchain import lifeline_guard

_GUARD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lifeline_guard.py")


class _Guard:
  """This process's guard: its pid, this process's end of its socket, and what it was told (told again to a new
  guard where the last one died)."""

  def __init__(self) -> None:
    self.lock = threading.Lock()
    self.pid: int | None = None
    self.end: socket.socket | None = None
    self.live: set[bytes] = set()  # the records of what it is to kill or remove now: b"g1234", b"f/tmp/..."

  def watch(self, what: bytes) -> None:
    """Tells the guard to kill or remove ``what`` should this process die (starting it where none runs)."""
    with self.lock:
      self.live.add(what)
      if self.end is not None and self._sent(b"+" + what + b"\0"):
        return
      self._start()  # the first, or one in place of a guard that is gone: told everything live

  def forget(self, what: bytes) -> None:
    with self.lock:
      self.live.discard(what)
      if self.end is not None and not self._sent(b"-" + what + b"\0"):
        self._start()

  def _sent(self, data: bytes) -> bool:
    try:
      self.end.sendall(data, socket.MSG_NOSIGNAL)
      return True
    except OSError:  # the guard is gone (killed by someone)
      self._drop()
      return False

  def _start(self) -> None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # neither inherited by exec
    try:
      self.pid = _spawn(theirs.fileno())
    except BaseException:
      mine.close()
      raise
    finally:
      theirs.close()
    self.end = mine
    if self.live and not self._sent(b"".join(b"+" + what + b"\0" for what in self.live)):
      raise OSError(f"the compile guard ({_GUARD}) ended at its start")

  def _drop(self) -> None:
    """Ends a guard that cannot be told (killed first: a guard that sees our end close kills our compiles)."""
    end, self.end = self.end, None
    pid, self.pid = self.pid, None
    if pid is not None:
      with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    if end is not None:
      end.close()
    if pid is not None:
      with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)

  def forget_inherited(self) -> None:
    """In a child made by os.fork: the guard and its socket are the parent's (they watch its compiles); the child
    closes its copy, so that the guard sees its caller end when the parent does, and starts its own when it
    compiles."""
    self.lock = threading.Lock()  # a thread of the parent may have held it when the process forked
    end, self.end, self.pid, self.live = self.end, None, None, set()
    if end is not None:
      with contextlib.suppress(OSError):
        end.close()


def _spawn(fd: int) -> int:
  """Starts the guard program with ``fd`` as its standard input, in a session of its own, holding no other
  descriptor of this process's (those exec does not close are closed for it, as subprocess's close_fds does)."""
  if fd <= 2:  # this process runs with a standard descriptor closed: the socket took its number
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    try:
      return _spawn(moved)
    finally:
      os.close(moved)
  actions = [(os.POSIX_SPAWN_DUP2, fd, 0), (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0)]
  with contextlib.suppress(OSError):
    for name in os.listdir("/proc/self/fd"):
      other = int(name)
      if other > 2 and other != fd and _inheritable(other):
        actions.append((os.POSIX_SPAWN_CLOSE, other))
  return os.posix_spawn(sys.executable, [sys.executable, "-I", "-S", _GUARD], os.environ, file_actions=actions,
                        setsid=True)


def _inheritable(fd: int) -> bool:
  try:
    return os.get_inheritable(fd)
  except OSError:  # the listing's own descriptor, closed by now
    return False


_guard = _Guard()
os.register_at_fork(after_in_child=_guard.forget_inherited)


def watch_group(group: int) -> None:
  """The guard kills process group ``group`` if this process dies before `forget_group` (starting the guard if it
  is not running). Tell it before the group can start anything: what it starts before then could outlive us."""
  _guard.watch(b"g%d" % group)


def forget_group(group: int) -> None:
  """``group`` is no longer the guard's to kill: call it before its leader is reaped (then its id may be anyone's)."""
  _guard.forget(b"g%d" % group)


def scratch_folder(prefix: str) -> str:
  """A new folder (mode 0700) in the temporary folder, ``prefix`` then its owner (this process) in its name, which
  the guard removes if this process dies before `remove_folder`: it is told first, so that no moment leaves the
  folder unknown to it."""
  folder_prefix = os.path.join(tempfile.gettempdir(), f"{prefix}{_owner()}-")
  while True:
    folder = folder_prefix + secrets.token_hex(4)
    record = b"f" + os.fsencode(folder)
    _guard.watch(record)
    try:
      os.mkdir(folder, 0o700)
      return folder
    except FileExistsError:  # a name this process gave before (its owner is in the name): another
      _guard.forget(record)
    except BaseException:
      _guard.forget(record)
      raise


def remove_folder(folder: str) -> None:
  """Removes a `scratch_folder`, then tells the guard it is gone."""
  shutil.rmtree(folder, ignore_errors=True)
  _guard.forget(b"f" + os.fsencode(folder))


def guard_pid() -> int | None:
  """This process's guard (None before its first bounded compile): for tests that kill it with its caller."""
  return _guard.pid


# ---------------------------------------------------------------------------------------------- the sweep

# A scratch folder's owner, in its name: the pid namespace (pids mean nothing across containers that share a
# temporary folder), the pid and the process's start time.
_OWNED = re.compile(r"(\d{1,20})\.(\d{1,10})\.(\d{1,20})-[0-9a-f]{8}")
_swept: set[tuple[str, str]] = set()  # (temporary folder, prefix) swept by this process
_owner_of: tuple[int, str] | None = None  # (pid, the owner part of its folders' names)


def _start_time(pid: int) -> str | None:
  """A process's start time (clock ticks after boot, /proc/PID/stat's 22nd field), None where it is gone: with its
  pid, it names one process, whatever later process takes the pid."""
  try:
    with open(f"/proc/{pid}/stat", "rb") as f:
      fields = f.read(4096).rsplit(b")", 1)[1].split()
    return fields[19].decode() if fields[0] not in (b"Z", b"X") else None  # a zombie's run has ended
  except (OSError, IndexError):
    return None


def _pid_namespace() -> str:
  try:
    return str(os.stat("/proc/self/ns/pid").st_ino)
  except OSError:
    return "0"


def _owner() -> str:
  global _owner_of
  pid = os.getpid()
  if _owner_of is None or _owner_of[0] != pid:  # a forked child is another owner
    _owner_of = (pid, f"{_pid_namespace()}.{pid}.{_start_time(pid) or 0}")
  return _owner_of[1]


def sweep(prefix: str) -> list[str]:
  """Removes the `scratch_folder` s of ``prefix`` in the temporary folder whose owner is gone (a caller killed with
  its guard): folders (not symlinks) owned by this user, named as `scratch_folder` names them. Once per process and
  temporary folder. Returns what it removed."""
  where = tempfile.gettempdir()
  if (where, prefix) in _swept:
    return []
  _swept.add((where, prefix))
  removed, namespace = [], _pid_namespace()
  if namespace == "0":  # no /proc: no owner can be told alive from gone
    return removed
  try:
    names = os.listdir(where)
  except OSError:
    return removed
  for name in names:
    found = _OWNED.fullmatch(name[len(prefix):]) if name.startswith(prefix) else None
    if found is None or found[1] != namespace or found[3] == "0" or _start_time(int(found[2])) == found[3]:
      continue  # not named by us, or by a process we cannot see, or its owner lives
    folder = os.path.join(where, name)
    before = os.path.exists(folder)
    lifeline_guard.remove_own_folder(folder)
    if before and not os.path.lexists(folder):
      removed.append(folder)
  return removed
