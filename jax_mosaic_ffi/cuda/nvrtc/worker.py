"""One NVRTC compile with a time bound: the worker process that runs `program.py`.

NVRTC cannot be interrupted: a template that explodes keeps it busy for
minutes, and Ctrl-C does not reach it. So by default compiles run in a
worker process (program.py run as a script), kept alive between compiles and
killed when one takes longer than ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``
seconds (default 300, at most a week; the whole compile's deadline where a
front end opened one: base/compile_timeout.py) or the caller is interrupted.
Set it to 0 to compile in the calling process, with no bound. A child made by
``os.fork`` (multiprocessing's default on Linux) leaves its parent's worker
alone and starts its own.

The worker runs in a process group of its own (a Ctrl-C at the terminal is
the caller's to handle: it kills the worker), watched by this process's guard
(toolchain/lifeline.py), which kills it and removes its scratch folder when the
caller ends without closing it (killed, or ``os._exit``). A caller killed
together with its guard leaves its worker's folder: the next process to start
a worker removes it (its name records its owner, who is gone).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import select
import signal
import subprocess
import sys
import threading
import time

from jax_mosaic_ffi.base import compile_jobs
from jax_mosaic_ffi.base import compile_timeout
from jax_mosaic_ffi.toolchain import lifeline as lifeline_lib
from jax_mosaic_ffi.cuda.nvrtc import program
from jax_mosaic_ffi.cuda.nvrtc.program import LENGTH, NvrtcFailure, compile_here, write_message

TIMEOUT_ENV = compile_timeout.ENV
DEFAULT_TIMEOUT_S = compile_timeout.DEFAULT_S
MAX_TIMEOUT_S = compile_timeout.MAX_S
_MAX_REPLY_BYTES = 1 << 30
_SCRATCH_PREFIX = "jmf-nvrtc-"
# The longest a wait for the worker sleeps between looks at Python's pending signals (a Ctrl-C that Linux gave to
# another thread is raised in the main thread only once its system call returns).
_WAKE_S = 0.1


class NvrtcTimeout(Exception):
  pass


def timeout_s() -> float | None:
  """The bound from the environment (base/compile_timeout.py); None means: compile in this process."""
  return compile_timeout.seconds()


class _Worker:
  """A child process that compiles requests one after another.

  Kept alive between compiles, so NVRTC's start-up is paid once per process,
  not once per kernel; killed (and replaced on the next compile) when a
  compile runs out of time or the caller is interrupted.
  """

  def __init__(self):
    self._process = None
    self._answers = None  # the read end of the worker's answer pipe
    # The worker's folder for NVRTC's trace files: ours to remove, as a killed worker cannot.
    self._scratch = None
    self._watched = False  # whether this process's guard (toolchain/lifeline.py) watches the worker's group
    self._lock = threading.Lock()

  def _start(self) -> None:
    lifeline_lib.sweep(_SCRATCH_PREFIX)  # what callers killed with their guard left, once per process
    read_end, write_end = os.pipe()
    self._scratch = lifeline_lib.scratch_folder(_SCRATCH_PREFIX)  # this process's guard removes it if we die
    try:
      self._process = subprocess.Popen([sys.executable, "-P", program.__file__, str(write_end),
                                        self._scratch], stdin=subprocess.PIPE, pass_fds=(write_end,),
                                       process_group=0)
      lifeline_lib.watch_group(self._process.pid)  # killed by the guard if we die (a worker ends with its input)
      self._watched = True
    except BaseException:
      os.close(read_end)
      self._stop()
      raise
    finally:
      os.close(write_end)
    self._answers = os.fdopen(read_end, "rb", buffering=0)

  def _forget_group(self, process) -> None:
    """Before the worker is reaped: then its group's id may be anyone's."""
    if self._watched:
      self._watched = False
      lifeline_lib.forget_group(process.pid)

  def compile(self, request: dict, seconds: float) -> dict:
    with self._lock:
      if self._process is None or self._process.poll() is not None:
        self._stop()
        self._start()
      try:
        # The worker started in some earlier working directory: NVRTC resolves
        # relative include paths against the caller's current one.
        write_message(self._process.stdin, {**request, "cwd": _cwd()})
        status, payload = _read_message(self._answers, compile_timeout.deadline(seconds))
      except BaseException:
        self._stop()
        raise
      if status == "failure":
        # After a failed compile NVRTC's time trace of the process's later compiles can leave headers out (the
        # prelude among them), and those name what a cache entry depends on: the next compile gets a new worker.
        self.close()
    if status == "failure":
      raise NvrtcFailure(payload)
    if status == "error":
      raise RuntimeError(payload)
    return payload

  def _stop(self) -> None:
    process, self._process = self._process, None
    answers, self._answers = self._answers, None
    if process is not None:
      with contextlib.suppress(OSError):
        os.killpg(process.pid, signal.SIGKILL)  # with whatever it started; before it is reaped
      self._forget_group(process)
      process.wait()
      process.stdin.close()
    if answers is not None:
      answers.close()
    self._remove_scratch()

  def _remove_scratch(self) -> None:
    scratch, self._scratch = self._scratch, None
    if scratch is not None:
      lifeline_lib.remove_folder(scratch)

  def forget_inherited(self) -> None:
    """In a child made by os.fork: the worker, its pipes and its scratch folder are the parent's, in use by the
    parent's compiles. They are dropped without being touched (no kill, no wait, no removal, no flush into the
    parent's request pipe): the child's first compile starts a worker of its own. Our copies of the pipes are
    pointed at /dev/null, which closes them here (the parent's worker sees its input close when the parent
    closes it, not when every child has); the objects are kept, so that collecting them never closes a
    descriptor number the child has reused."""
    process, answers = self._process, self._answers
    self._process = self._answers = self._scratch = None
    self._watched = False  # the parent's guard watches it; the child's knows nothing of it
    self._lock = threading.Lock()  # a thread of the parent may have held it when the process forked
    if process is None:
      return
    _inherited.append((process, answers))
    with open(os.devnull, "rb") as devnull:
      for stream in (process.stdin, answers):
        try:
          os.dup2(devnull.fileno(), stream.fileno())
        except (OSError, ValueError):  # already closed
          pass

  def close(self) -> None:
    """Ends the worker: it exits when its input closes."""
    process, self._process = self._process, None
    answers, self._answers = self._answers, None
    if process is not None:
      # No longer the guard's before it may be reaped (wait reaps it); it ends by itself once its input closes.
      self._forget_group(process)
      process.stdin.close()
      try:
        process.wait(timeout=5)
      except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    if answers is not None:
      answers.close()
    self._remove_scratch()


def _cwd() -> str | None:
  try:
    return os.getcwd()
  except OSError:  # deleted under us
    return None


_worker = _Worker()  # the first: every compile made one at a time runs in it
# Compiles side by side (store/ahead.py) each take a worker of their own, up to JAX_MOSAIC_FFI_COMPILE_JOBS: the
# first that is idle, else a new one, else they wait for one.
_workers = [_worker]
_idle = [_worker]
_pool = threading.Condition()
# What a forked child inherited from its parent's workers: kept, never used (_Worker.forget_inherited).
_inherited: list = []


def _close_all() -> None:
  for worker in list(_workers):
    worker.close()


def _forget_inherited() -> None:
  global _pool
  for worker in _workers:
    worker.forget_inherited()
  _pool = threading.Condition()  # a thread of the parent may have held it when the process forked
  _workers[:], _idle[:] = [_worker], [_worker]  # the others' objects stay in _inherited's care


atexit.register(_close_all)
os.register_at_fork(after_in_child=_forget_inherited)


def _take() -> _Worker:
  with _pool:
    while True:
      if _idle:
        return _idle.pop(0)  # the first worker first: a lone compile always runs in it
      if len(_workers) < compile_jobs.count():
        worker = _Worker()
        _workers.append(worker)
        return worker
      _pool.wait()


def _give_back(worker: _Worker) -> None:
  with _pool:
    _idle.append(worker)
    _idle.sort(key=_workers.index)
    _pool.notify()


def compile_bounded(request: dict, seconds: float | None) -> dict:
  """`compile_here` in a worker process, stopped after ``seconds``; in this process when None."""
  if seconds is None:
    return compile_here(request)
  worker = _take()
  try:
    return worker.compile(request, seconds)
  finally:
    _give_back(worker)


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
  chunks = []
  while size > 0:
    if deadline is not None:
      remaining = deadline - time.monotonic()
      if remaining <= 0:
        raise NvrtcTimeout(
            f"NVRTC did not finish within the {TIMEOUT_ENV} bound and was stopped. Set it higher to allow "
            "longer compiles (0: no bound)")
      if not select.select([fd], [], [], min(remaining, _WAKE_S))[0]:
        continue
    chunk = os.read(fd, min(size, 1 << 20))
    if not chunk:
      raise RuntimeError("the NVRTC worker process died (see its output above)")
    chunks.append(chunk)
    size -= len(chunk)
  return b"".join(chunks)


def _read_message(stream, deadline: float | None):
  fd = stream.fileno()
  (length,) = LENGTH.unpack(_read_exactly(fd, LENGTH.size, deadline))
  if length > _MAX_REPLY_BYTES:
    raise RuntimeError(f"the NVRTC worker sent a reply of {length} bytes")
  return pickle.loads(_read_exactly(fd, length, deadline))  # our own child's reply
