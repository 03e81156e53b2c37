"""A compile in a child forked from this process, killed at its deadline: `run`.

Triton's and the CuTe DSL's compiles run Python (the kernel's trace), MLIR passes and ptxas in the process that
holds the kernel's Python objects, and nothing stops one of those from outside once it started. So a bounded
compile forks: the child, a copy of this process holding the same objects, compiles and sends back the bytes the
compile cache would store, and the parent waits until the deadline, then kills the child's process group (a ptxas
it started with it). The parent stays as it was: a compile that ran past its bound, or crashed (a segfault in an
MLIR pass), costs a child, never the caller's process. A parent killed outright runs nothing: its guard
(toolchain/lifeline.py, one per process, told the child's group before the child starts its work) then kills the
group and removes its files. Once the answer is read, the child is reaped and its folder removed in a thread of
this process's: the answer does not wait for them (a failure does, so that its error finds nothing left). The
deadline is the whole compile's where a front end opened one (base/compile_timeout.py's `whole_compile`), so the
pieces of one compile (an IR key's trace, the compile, the audit's witness) share one bound.

The wait wakes at least every `_WAKE_S`, so that a Ctrl-C that Linux delivered to another thread than the waiting
one (any thread may take a signal sent to the process) is raised here at once, not at the deadline.

What comes back is bounded as a disk-cache entry is: its length is checked before it is read, its sha256 digest
after, and the front end's own ``decode`` reads it; a failure comes back as the exception the compile raised (its
class, message and attributes). A killed compile leaves nothing: no cache entry (the caller stores only a result)
and no file (the child's temporary files go in a folder of its own, which the parent removes).

The child reports each stage it starts (`stage`), so a timeout names where the time went.

Why a fork and not a fresh process: the kernel is a Python function of the user's program (a closure, a notebook
cell), which only a copy of this process holds. The child runs the compiler and nothing else: no GPU (CUDA does not
survive a fork), no JAX. Like every forked child of a threaded process, it would wait forever on a lock another
thread held at the fork; the compilers take none that way (each front end compiles under its own lock, held by
the forking thread), and the bound would end such a wait too.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import os
import pickle
import select
import signal
import struct
import sys
import tempfile
import threading
import time
import warnings
from typing import Callable

from jax_mosaic_ffi.base import compile_timeout
from jax_mosaic_ffi.toolchain import lifeline as lifeline_lib

# A kernel's binaries are far smaller; the disk cache reads no larger entry either.
MAX_RESULT_BYTES = 256 << 20
_MAX_FAILURE_BYTES = 16 << 20
_MAX_STAGE_BYTES = 4096
_HEADER = struct.Struct("<cQ")  # tag, length
_DIGEST_BYTES = 32
_PR_SET_PDEATHSIG = 1
# What the parent is warned of at a fork (JAX's and Python's warnings that a threaded process forks): the child
# runs only the compiler, which takes no lock another thread may hold.
_FORK_WARNINGS = r"(?s).*(os\.fork\(\) was called|multi-threaded, use of fork\(\))"
# The longest the parent's wait sleeps between looks at Python's pending signals (a handler runs only in the main
# thread, and only when it is not blocked in a system call the signal did not interrupt).
_WAKE_S = 0.1

_reports: int | None = None  # in a child: the pipe it answers on


class Stopped(Exception):
  """The compile ran past its bound and its process was killed; ``stage`` is the last stage it reported (else
  `run`'s ``first_stage``)."""

  def __init__(self, stage: str):
    super().__init__(stage)
    self.stage = stage


class Died(Exception):
  """The compile's process ended without an answer (``how``: "signal 11 (SIGSEGV)", "exit status 1"), in
  ``stage``."""

  def __init__(self, how: str, stage: str):
    super().__init__(f"{how} in {stage or 'its start'}")
    self.how, self.stage = how, stage


def in_child() -> bool:
  """Whether this process is a forked compile's child."""
  return _reports is not None


def stage(name: str) -> None:
  """In a forked compile's child: the stage it starts now (named in a `Stopped`); elsewhere nothing."""
  if _reports is not None:
    with contextlib.suppress(OSError):
      _send(_reports, b"S", name.encode()[:_MAX_STAGE_BYTES])


def run(work: Callable[[], bytes], seconds: float | None, first_stage: str = "") -> bytes:
  """``work()`` in a child forked from this process, killed after ``seconds`` (`Stopped`), or at the whole
  compile's deadline where that is earlier; None: here, unbounded (as in a child already). What it raises is raised
  here; a child that dies without an answer raises `Died`. ``first_stage``: the stage it is in until it reports
  one (its process's start counts towards it)."""
  if seconds is None or in_child():
    return work()
  deadline = compile_timeout.deadline(seconds)
  if deadline <= time.monotonic():  # the whole compile's time is spent: no piece starts
    raise Stopped(first_stage)
  for stream in (sys.stdout, sys.stderr):  # or the child would print what this process buffered, again
    with contextlib.suppress(Exception):
      stream.flush()
  _find_prctl()
  scratch = lifeline_lib.scratch_folder("jmf-compile-")  # this process's guard knows it before it exists
  parent = os.getpid()
  read_end, write_end = os.pipe()
  go_read, go_write = os.pipe()  # the child starts its work once its group is the guard's
  child = None
  try:
    with warnings.catch_warnings(), _interrupts_held():
      warnings.filterwarnings("ignore", _FORK_WARNINGS)
      pid = os.fork()
      if pid == 0:
        _child(work, read_end, write_end, go_read, go_write, scratch, parent)  # never returns
      child = _Child(pid)
      with contextlib.suppress(OSError):  # the child does it too: whichever runs first
        os.setpgid(pid, pid)
      lifeline_lib.watch_group(pid)
      child.watched = True
      os.write(go_write, b"g")
  except BaseException:
    if child is not None:
      child.end()
    for fd in (read_end, write_end, go_read, go_write):
      os.close(fd)
    lifeline_lib.remove_folder(scratch)
    _reaper.wait()
    raise
  for fd in (write_end, go_read, go_write):
    os.close(fd)
  try:
    data = _answer(read_end, child, deadline, first_stage)
  except BaseException:
    child.end()
    lifeline_lib.remove_folder(scratch)
    _reaper.wait()  # so that a failed compile has left nothing when its error is raised
    raise
  finally:
    os.close(read_end)
  _reaper.later(child, scratch)  # the answer is read: the rest is off the caller's path
  return data


@contextlib.contextmanager
def _interrupts_held():
  """A Ctrl-C during the forks, raised after them. Python runs the handlers `os.register_at_fork` registered
  (logging's, ...) after each fork and drops what they raise, so a KeyboardInterrupt raised in one is lost: the
  interrupt is held by a handler of ours meanwhile (in the main thread, where Python runs signal handlers, and only
  while Python's own is in place)."""
  if threading.current_thread() is not threading.main_thread() or \
      signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
    yield
    return
  caught = []
  signal.signal(signal.SIGINT, lambda number, frame: caught.append(number))
  try:
    yield
  finally:
    signal.signal(signal.SIGINT, signal.default_int_handler)
  if caught:
    raise KeyboardInterrupt


def _child(work: Callable[[], bytes], read_end: int, write_end: int, go_read: int, go_write: int, scratch: str,
           parent: int) -> None:
  global _reports
  status = 0
  try:
    os.close(read_end)
    os.close(go_write)
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler and threading.current_thread() is \
        threading.main_thread():  # the parent's handler of its forks (_interrupts_held): Python's own here
      signal.signal(signal.SIGINT, signal.default_int_handler)
    os.setpgid(0, 0)  # its own group: the parent kills it with whatever it started
    _die_with(parent)
    if os.read(go_read, 1) != b"g":  # the parent ended before its guard knew this group: nothing starts
      os._exit(1)
    os.close(go_read)
    _reports = write_end
    tempfile.tempdir = scratch  # Triton's PTX and cubin files, and ptxas's, are the parent's to remove
    os.environ["TMPDIR"] = scratch
    try:
      data = work()
      if not isinstance(data, bytes):
        raise TypeError(f"a forked compile answers bytes, not {type(data).__name__}")
      _send(write_end, b"R", hashlib.sha256(data).digest() + data)
    except BaseException as e:  # noqa: BLE001  (every failure goes to the parent, which raises it)
      _send(write_end, b"E", _failure(e))
  except BaseException:  # noqa: BLE001  (the answer could not be sent: the parent says the child died)
    status = 1
  finally:
    for stream in (sys.stdout, sys.stderr):
      with contextlib.suppress(Exception):
        stream.flush()
    os._exit(status)  # no atexit handler of the parent's runs in its copy


def _die_with(parent: int) -> None:
  """This child killed when its parent ends (Linux's PR_SET_PDEATHSIG), so a parent killed outright leaves no
  compile running; and ended now if the parent already has."""
  if _prctl is not None:
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
  if os.getppid() != parent:
    os._exit(1)


def _find_prctl():
  """libc's prctl, looked up once in the parent (a child's lookup would be on the compile's path)."""
  global _prctl, _prctl_looked_up
  if not _prctl_looked_up:
    _prctl_looked_up = True
    with contextlib.suppress(OSError, AttributeError):
      _prctl = ctypes.CDLL(None, use_errno=True).prctl


_prctl = None
_prctl_looked_up = False


def _failure(e: BaseException) -> bytes:
  """The exception as the parent rebuilds it: class, arguments and attributes; a plain RuntimeError with its text
  where those do not pickle."""
  try:
    data = pickle.dumps((type(e), e.args, dict(vars(e))))
    _rebuilt(data)
  except Exception:  # noqa: BLE001
    data = pickle.dumps((RuntimeError, (f"{type(e).__name__}: {e}",), {}))
  return data


def _rebuilt(data: bytes) -> BaseException:
  kind, args, state = pickle.loads(data)  # our own child's answer
  if not (isinstance(kind, type) and issubclass(kind, BaseException)):
    raise TypeError("not an exception")
  error = kind.__new__(kind)
  error.args = args
  vars(error).update(state)
  return error


def _send(fd: int, tag: bytes, payload: bytes) -> None:
  data = _HEADER.pack(tag, len(payload)) + payload
  while data:
    data = data[os.write(fd, data):]


def _answer(fd: int, child: _Child, deadline: float, reached: str) -> bytes:
  while True:
    header = _read(fd, _HEADER.size, deadline, reached)
    if header is None:
      raise Died(child.end(), reached)
    tag, length = _HEADER.unpack(header)
    limit = {b"S": _MAX_STAGE_BYTES, b"E": _MAX_FAILURE_BYTES, b"R": _DIGEST_BYTES + MAX_RESULT_BYTES}.get(tag, -1)
    if not 0 <= length <= limit:
      raise RuntimeError(f"a forked compile answered a message {tag!r} of {length} bytes")
    payload = _read(fd, length, deadline, reached)
    if payload is None:
      raise Died(child.end(), reached)
    if tag == b"S":
      reached = payload.decode(errors="replace")
    elif tag == b"E":
      raise _rebuilt(payload)
    else:
      digest, data = payload[:_DIGEST_BYTES], payload[_DIGEST_BYTES:]
      if hashlib.sha256(data).digest() != digest:
        raise RuntimeError("a forked compile's answer does not match its digest")
      return data


def _read(fd: int, size: int, deadline: float, reached: str) -> bytes | None:
  """``size`` bytes, or None at the end of the pipe; `Stopped` at the deadline."""
  chunks = []
  while size > 0:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
      raise Stopped(reached)
    if not select.select([fd], [], [], min(remaining, _WAKE_S))[0]:
      continue
    chunk = os.read(fd, min(size, 1 << 20))
    if not chunk:
      return None
    chunks.append(chunk)
    size -= len(chunk)
  return b"".join(chunks)


class _Child:
  """A forked compile's process, ended once: its group killed before it is reaped (so the group's id is no one
  else's yet: a ptxas it started goes with it), then no longer the guard's, then reaped."""

  def __init__(self, pid: int):
    self.pid = pid
    self.watched = False  # whether this process's guard (toolchain/lifeline.py) watches its group
    self.how: str | None = None

  def end(self) -> str:
    """How it ended: "signal 11 (SIGSEGV)", "exit status 1"."""
    if self.how is None:
      with contextlib.suppress(OSError):
        os.killpg(self.pid, signal.SIGKILL)
      if self.watched:
        lifeline_lib.forget_group(self.pid)
        self.watched = False
      _, status = os.waitpid(self.pid, 0)
      self.how = _described(status)
    return self.how


class _Reaper:
  """Ends children whose answer was read, and removes their scratch, in a thread of its own while there are any:
  reaping one waits until the kernel has torn down its copy of this process, milliseconds the caller need not wait.
  No thread stays once they are done (a fork from a process with threads of ours would warn); the last ones are
  ended at exit, and a forked child leaves its parent's to the parent."""

  def __init__(self) -> None:
    self._lock = threading.Lock()
    self._pending: list[tuple[_Child, str]] = []
    self._thread: threading.Thread | None = None

  def later(self, child: _Child, scratch: str) -> None:
    with self._lock:
      self._pending.append((child, scratch))
      if self._thread is not None:
        return
      try:
        self._thread = threading.Thread(target=self._run, name="jmf-compile-reaper", daemon=True)
        self._thread.start()
      except RuntimeError:  # no new thread at the interpreter's shutdown: ended here
        self._thread = None
        self._pending.remove((child, scratch))
      else:
        return
    _end(child, scratch)

  def _run(self) -> None:
    while True:
      with self._lock:
        if not self._pending:
          self._thread = None
          return
        child, scratch = self._pending.pop(0)
      _end(child, scratch)

  def wait(self) -> None:
    """Until every child handed over is ended."""
    with self._lock:
      thread = self._thread
    if thread is not None and thread is not threading.current_thread():
      thread.join()

  def forget_inherited(self) -> None:
    """In a child made by os.fork: the pending children are the parent's (it reaps them, not this process)."""
    self._lock = threading.Lock()
    self._pending, self._thread = [], None


def _end(child: _Child, scratch: str) -> None:
  with contextlib.suppress(ChildProcessError):  # reaped by someone else's os.wait()
    child.end()
  lifeline_lib.remove_folder(scratch)


_reaper = _Reaper()
atexit.register(_reaper.wait)
os.register_at_fork(after_in_child=_reaper.forget_inherited)


def _described(status: int) -> str:
  if os.WIFSIGNALED(status):
    number = os.WTERMSIG(status)
    with contextlib.suppress(ValueError):
      return f"signal {number} ({signal.Signals(number).name})"
    return f"signal {number}"
  return f"exit status {os.waitstatus_to_exitcode(status)}"
