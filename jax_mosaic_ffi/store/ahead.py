"""Entries made ahead, side by side: `compile_ahead`, and the pool it starts compiles on (`POOL`, `Pending`).

Inside ``with jmf.compile_ahead():`` a front end that knows a kernel and its arguments (``cuda_kernel(...)``) starts
its compile at once (store/stack.py's `start`) and returns; the compile runs on a pool of at most
``JAX_MOSAIC_FFI_COMPILE_JOBS`` threads (default: this process's CPUs), each waiting on a compiler's own process
(NVRTC's worker, a forked compile), so the program's kernels compile side by side. What needs a kernel (its
``mosaic_kernel``, its lowering) waits for that one only, and runs it itself if the pool has not started it yet; a
lookup of an entry being made ahead (`get_or_make`) waits for it, never makes it twice. A compile that failed raises
its error where its kernel is first needed, and at the block's end, whichever comes first: the same error, naming
the line that made the kernel, and its traceback ends on that line.

The pool and a job's claims (store/job_share.py) work together: a compile started ahead that a peer of the job has
claimed and not yet published steps aside once (`job_share.Parked`), so this process compiles the next kernel
meanwhile instead of waiting: the ranks of a job that make the same kernels in the same order split them. A memory
hit is served at once, as without the block: a warm process runs as it did.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import os
import threading
from typing import Any, Callable

from jax_mosaic_ffi.base import compile_jobs
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base import source_origin
from jax_mosaic_ffi.store import job_share
from jax_mosaic_ffi.store.entries import Found

_IDLE_S = 30.0  # an idle pool thread ends after this long: a process that compiled once keeps no threads
_SCOPE: contextvars.ContextVar[list | None] = contextvars.ContextVar("jax_mosaic_ffi_compile_ahead", default=None)


class Pending:
  """An entry being made ahead: `result` waits for it, the `Found` or the error its making raised (raised again
  with the traceback it had, each time it is asked)."""

  def __init__(self, found: Found | None = None):
    self._done = threading.Event()
    self._found, self._error, self._traceback = found, None, None
    self.task: _Task | None = None  # its task while no thread of the pool has settled it
    if found is not None:
      self._done.set()

  def done(self) -> bool:
    return self._done.is_set()

  def result(self) -> Found:
    task = self.task
    if not self._done.is_set() and task is not None:
      POOL.run_now(task)  # not started by the pool: this thread makes it, rather than wait for a free one
    self._done.wait()
    if self._error is not None:
      raise self._error.with_traceback(self._traceback)
    return self._found

  def settle(self, found: Found | None, error: BaseException | None, origin) -> None:
    """``origin``: the traceback of the line that started it, which an error is raised with (else its own)."""
    self._found, self._error = found, error
    self._traceback = None if error is None else origin or error.__traceback__
    self.task = None
    self._done.set()


class _Task:
  def __init__(self, key, make: Callable[[], Found], pending: Pending):
    self.key, self.make, self.pending = key, make, pending
    self.context = contextvars.copy_context()  # the starting call's (a called_as, a pinned call site)
    # The user's line that started it, as messages name it ("called at model.py:12") and as the traceback of its
    # error ends, and the user's frames an error's source lines are looked for in (base/source_origin.py).
    self.site = source_location.current()
    self.frames = source_origin.user_frames()
    self.origin = source_origin.traceback_at(self.frames)
    self.parked = False  # it stepped aside for a peer's claim once: it now waits for the peer
    self.running = False


class Pool:
  """At most ``JAX_MOSAIC_FFI_COMPILE_JOBS`` threads making the entries started ahead, the oldest first, those
  that stepped aside for a peer's claim after every other."""

  def __init__(self):
    self._reset()
    os.register_at_fork(after_in_child=self._forked)

  def _reset(self) -> None:
    self._cond = threading.Condition()
    self._fresh: collections.deque[_Task] = collections.deque()
    self._parked: collections.deque[_Task] = collections.deque()
    self._tasks: dict[Any, _Task] = {}  # every task not yet settled, by its entry's key
    self._threads = self._idle = 0

  def start(self, key, make: Callable[[], Found]) -> Pending:
    """``make()`` on the pool, or the `Pending` of the task already started for ``key``."""
    limit = compile_jobs.count()  # read at each start: a mistaken setting is named at the first
    with self._cond:
      task = self._tasks.get(key)
      if task is not None:
        return task.pending
      pending = Pending()
      task = pending.task = _Task(key, make, pending)
      self._tasks[key] = task
      self._fresh.append(task)
      if self._idle == 0 and self._threads < limit:
        self._threads += 1
        threading.Thread(target=self._work, name="jax_mosaic_ffi compile ahead", daemon=True).start()
      else:
        self._cond.notify()
    return pending

  def running(self, key) -> Pending | None:
    """The `Pending` of ``key`` where it is being made ahead, else None (a dict's read: a warm lookup's cost)."""
    task = self._tasks.get(key) if self._tasks else None
    return None if task is None else task.pending

  def run_now(self, task: _Task) -> None:
    """Makes ``task`` in the calling thread where no thread of the pool has taken it (else nothing)."""
    with self._cond:
      if task.running or self._tasks.get(task.key) is not task:
        return
      (self._parked if task.parked else self._fresh).remove(task)
      task.running = True
    self._run(task, may_park=False)

  def _work(self) -> None:
    while True:
      with self._cond:
        while not self._fresh and not self._parked:
          self._idle += 1
          woken = self._cond.wait(_IDLE_S)
          self._idle -= 1
          if not woken and not self._fresh and not self._parked:
            self._threads -= 1
            return
        task = self._fresh.popleft() if self._fresh else self._parked.popleft()
        task.running = True
      self._run(task, may_park=not task.parked)

  def _run(self, task: _Task, may_park: bool) -> None:
    try:
      found = task.context.run(_made_in, task, may_park)
    except job_share.Parked:
      with self._cond:  # a peer makes it: this thread makes the next one, and comes back to it after every other
        task.parked, task.running = True, False
        self._parked.append(task)
        self._cond.notify()
      return
    except BaseException as error:  # noqa: BLE001 - the caller's, raised where it asks for the entry
      self._settle(task, None, error)
      return
    self._settle(task, found, None)

  def _settle(self, task: _Task, found, error) -> None:
    with self._cond:
      self._tasks.pop(task.key, None)
    task.pending.settle(found, error, task.origin)
    task.frames = task.origin = None

  def _forked(self) -> None:
    """In a child made by os.fork: the parent's threads are not here. Its tasks not yet settled are made again when
    the child asks for them (in the asking thread), never by a thread that does not exist."""
    tasks = list(self._tasks.values())
    self._reset()
    for task in tasks:
      task.parked = task.running = False
      self._tasks[task.key] = task
      self._fresh.append(task)


def _made_in(task: _Task, may_park: bool) -> Found:
  with job_share.parking(may_park), source_location.pinned(task.site), source_origin.seen_from(task.frames):
    return task.make()


POOL = Pool()


def started(pending: Pending) -> Pending:
  """Notes ``pending`` as started inside the innermost `compile_ahead` block, which waits for it at its end."""
  scope = _SCOPE.get()
  if scope is not None:
    scope.append(pending)
  return pending


def active() -> bool:
  """Whether the caller is inside a `compile_ahead` block: a front end then starts its compiles ahead."""
  return _SCOPE.get() is not None


@contextlib.contextmanager
def compile_ahead():
  """Compiles the kernels made inside side by side: each ``cuda_kernel(...)`` starts its compile and returns at
  once, on a pool of ``JAX_MOSAIC_FFI_COMPILE_JOBS`` threads (default: this process's CPUs), and what needs a kernel
  (its ``mosaic_kernel``, a lowering) waits for that kernel only. The block's end waits for every compile started in
  it; a compile that failed raises its error (the same `CompileError`, naming the line that made the kernel) where
  its kernel is first needed, or at the block's end. Kernels already compiled (in memory, on disk, in a pack) are
  served as without it. In a job of several processes, the processes that make the same kernels split the compiles
  between them (:doc:`deploying </guides/deploying>`)::

    >>> sources = {n: f'extern "C" __global__ void {n}(float* y) {{ y[0] = 1.0f; }}' for n in ("one", "two")}
    >>> with jmf.compile_ahead():
    ...   kernels = [jmf.cuda_kernel(source, name) for name, source in sources.items()]
    >>> [k.symbol for k in kernels]
    ['one', 'two']
  """
  scope: list[Pending] = []
  token = _SCOPE.set(scope)
  try:
    yield
  finally:
    _SCOPE.reset(token)
  for pending in scope:  # in the order they were started: the first failure is the first kernel's
    pending.result()
