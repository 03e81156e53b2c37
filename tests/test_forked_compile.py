"""A compile in a forked child (jax_mosaic_ffi/toolchain/forked_compile.py), with real processes: its answer and its
failures come back, a child past its bound is killed with what it started and names the stage it was in, a child
that crashes leaves this process working, and nothing of a stopped one stays behind (its process, its files), even
when its caller is killed outright; a Ctrl-C interrupts the wait at once, whichever thread Linux gave it to; the
pieces of one compile share one deadline."""

import faulthandler
import os
import signal
import subprocess
import tempfile
import threading
import time

import pytest

import fresh_process
from jax_mosaic_ffi.base import compile_timeout
from jax_mosaic_ffi.base.errors import CompileError
from jax_mosaic_ffi.toolchain import forked_compile


def test_the_answer_comes_back_from_another_process():
  parent = os.getpid()
  assert forked_compile.run(lambda: str(os.getpid() != parent).encode(), fresh_process.INNER_GUARD_S) == b"True"
  assert forked_compile.run(lambda: b"x" * (3 << 20), fresh_process.INNER_GUARD_S) == b"x" * (3 << 20)


def test_no_bound_runs_it_here():
  assert forked_compile.run(lambda: str(os.getpid()).encode(), None) == str(os.getpid()).encode()


def test_a_failure_comes_back_whole():
  def refused():
    raise CompileError("k", "the log", "", "", compiler="Triton", what="kernel 'k' for sm_90", advice="smaller")
  with pytest.raises(CompileError) as caught:
    forked_compile.run(refused, fresh_process.INNER_GUARD_S)
  expected = CompileError("k", "the log", "", "", compiler="Triton", what="kernel 'k' for sm_90", advice="smaller")
  assert str(caught.value) == str(expected)
  assert (caught.value.kernel, caught.value.log, caught.value.compiler) == ("k", "the log", "Triton")
  with pytest.raises(TypeError, match="a forked compile answers bytes, not str"):
    forked_compile.run(lambda: "text", fresh_process.INNER_GUARD_S)


class Unpicklable(Exception):
  def __init__(self, detail):
    super().__init__(f"with {detail}")
    self.lock = threading.Lock()


def test_a_failure_that_cannot_be_sent_comes_back_as_its_text():
  def refused():
    raise Unpicklable("a lock")
  with pytest.raises(RuntimeError, match="^Unpicklable: with a lock$"):
    forked_compile.run(refused, fresh_process.INNER_GUARD_S)


def test_past_its_bound_the_child_is_killed_naming_its_stage():
  def endless():
    threading.Event().wait()
  with pytest.raises(forked_compile.Stopped) as caught:  # 1 ms: its start alone takes longer, on any machine
    forked_compile.run(endless, 0.001, first_stage="the frontend for sm_90")
  assert caught.value.stage == "the frontend for sm_90"
  assert forked_compile.run(lambda: b"next", fresh_process.INNER_GUARD_S) == b"next"  # this process goes on


def _started_with_a_program(tmp_path):
  """A compile that starts a program, as a compile starts ptxas (in its process group, never ending by itself), and
  says so in ``tmp_path / "started"``: "PID SCRATCH"; and the marker that names that program as this test's."""
  started = tmp_path / "started"
  marker = f"0.0{os.getpid()}7"  # sleep adds its arguments: this one names it as this test's

  def endless():
    sleeper = subprocess.Popen(["sleep", str(int(fresh_process.HANG_GUARD_S)), marker])
    (tmp_path / "starting").write_text(f"{sleeper.pid} {tempfile.gettempdir()}")
    os.replace(tmp_path / "starting", started)
    threading.Event().wait()

  return endless, started, marker


def _interrupt_once_started(started, thread_id: int):
  def interrupt():
    deadline = time.monotonic() + fresh_process.INNER_GUARD_S  # a guard: the wait ends when the child started it
    while not started.exists() and time.monotonic() < deadline:
      time.sleep(0.01)
    signal.pthread_kill(thread_id, signal.SIGINT)  # Ctrl-C, given to that thread (not to whichever Linux picks)
  return interrupt


def _gone(tmp_path, started, marker):
  pid, scratch = started.read_text().split()
  assert scratch.startswith(str(tmp_path / "jmf-compile-")) and not os.path.exists(scratch)  # its files removed
  deadline = time.monotonic() + fresh_process.INNER_GUARD_S  # SIGKILL lands at once; the guard is for a hang
  while fresh_process.running(marker) and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not fresh_process.running(marker), pid  # killed with its group


def test_an_interrupted_compile_leaves_no_process_and_no_file_behind(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the child's scratch folder, found by its folder
  endless, started, marker = _started_with_a_program(tmp_path)
  threading.Thread(target=_interrupt_once_started(started, threading.get_ident()), daemon=True).start()
  with pytest.raises(KeyboardInterrupt):  # in the main thread's wait
    forked_compile.run(endless, fresh_process.INNER_GUARD_S)
  _gone(tmp_path, started, marker)
  assert forked_compile.run(lambda: b"next", fresh_process.INNER_GUARD_S) == b"next"


def test_a_ctrl_c_that_another_thread_takes_interrupts_the_wait_at_once(tmp_path, monkeypatch):
  # Linux gives a signal sent to the process to any thread that does not block it; Python runs its handler in the
  # main thread, which must not sleep on in its wait until the bound: a wait that did would see the interrupt only
  # when its select returns at the bound (far above the time a wake takes, on any machine).
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  endless, started, marker = _started_with_a_program(tmp_path)
  helper = threading.Thread(target=lambda: _interrupt_once_started(started, threading.get_ident())(), daemon=True)
  helper.start()
  bound = 120.0
  begun = time.monotonic()
  with pytest.raises(KeyboardInterrupt):
    forked_compile.run(endless, bound)
  assert time.monotonic() - begun < bound  # before the bound: not the deadline's doing
  _gone(tmp_path, started, marker)


def test_the_pieces_of_one_compile_share_its_deadline():
  # An IR key's trace, the compile, the audit's witness: each in a child of its own, none with a bound of its own.
  def endless():
    threading.Event().wait()
  with compile_timeout.whole_compile(0.5):
    with pytest.raises(forked_compile.Stopped):
      forked_compile.run(endless, fresh_process.INNER_GUARD_S, first_stage="the IR key's trace")
    with pytest.raises(forked_compile.Stopped) as caught:  # the time is spent: this piece does not start
      forked_compile.run(lambda: b"the compile", fresh_process.INNER_GUARD_S, first_stage="the compile")
    assert caught.value.stage == "the compile"
  assert forked_compile.run(lambda: b"the next compile", fresh_process.INNER_GUARD_S) == b"the next compile"


def test_a_child_that_crashes_leaves_this_process_working():
  def crash():
    forked_compile.stage("llir for sm_90")
    faulthandler.disable()  # pytest's would print this child's stack
    os.kill(os.getpid(), signal.SIGSEGV)
    threading.Event().wait()
  with pytest.raises(forked_compile.Died) as caught:
    forked_compile.run(crash, fresh_process.INNER_GUARD_S)
  assert (caught.value.how, caught.value.stage) == ("signal 11 (SIGSEGV)", "llir for sm_90")
  with pytest.raises(forked_compile.Died, match="exit status 3 in its start"):
    forked_compile.run(lambda: os._exit(3), fresh_process.INNER_GUARD_S)
  assert forked_compile.run(lambda: b"still here", fresh_process.INNER_GUARD_S) == b"still here"


def test_a_compile_inside_a_forked_one_runs_in_that_child():
  def nested():
    assert forked_compile.in_child()
    return forked_compile.run(lambda: str(os.getpid()).encode(), fresh_process.INNER_GUARD_S) + b" " + \
        str(os.getpid()).encode()
  inner, outer = forked_compile.run(nested, fresh_process.INNER_GUARD_S).split()
  assert inner == outer and not forked_compile.in_child()


ORPHANED = """
  import os, subprocess, sys, tempfile, threading
  from jax_mosaic_ffi.toolchain import forked_compile
  def endless():
    sleeper = subprocess.Popen(["sleep", sys.argv[2], sys.argv[3]])  # as a compile starts ptxas
    with open(os.path.join(tempfile.gettempdir(), "a file it writes"), "w") as f:
      f.write("partial")
    with open(sys.argv[1] + ".new", "w") as f:
      f.write(f"{os.getpid()} {tempfile.gettempdir()}")
    os.replace(sys.argv[1] + ".new", sys.argv[1])
    threading.Event().wait(float(sys.argv[2]))  # a guard: it is to die with its parent
  forked_compile.run(endless, 3600)
"""


def alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has ended
  except OSError:
    return False


def test_a_compile_whose_parent_is_killed_outright_ends_with_it(tmp_path):
  # The child and what it started (ptxas), and its scratch folder: a killed caller runs nothing, so its guard does.
  started = tmp_path / "child"
  marker = f"0.0{os.getpid()}3"
  parent = fresh_process.start(ORPHANED, started, int(fresh_process.INNER_GUARD_S), marker,
                               env={"TMPDIR": str(tmp_path)})
  try:
    deadline = time.monotonic() + fresh_process.INNER_GUARD_S  # a guard: the wait ends when the child started
    while not started.exists() and time.monotonic() < deadline and parent.poll() is None:
      time.sleep(0.01)
    child, scratch = started.read_text().split()
    assert alive(int(child)) and fresh_process.running(marker) and os.path.isdir(scratch)
  finally:
    parent.kill()  # SIGKILL: no handler of the parent's runs
    parent.communicate()
  deadline = time.monotonic() + fresh_process.INNER_GUARD_S  # the kernel kills it at once; the guard is for a hang
  while (alive(int(child)) or fresh_process.running(marker) or os.path.exists(scratch)) and \
      time.monotonic() < deadline:
    time.sleep(0.01)
  assert not alive(int(child))
  assert not fresh_process.running(marker)  # what it started, too
  assert not os.path.exists(scratch)  # and its files
