"""A process's compile guard (jax_mosaic_ffi/toolchain/lifeline.py and lifeline_guard.py), with real processes:
one guard per process whatever it compiles, a new one where it was killed; the guard takes only what it may (our
own folders, never through a symlink; groups that are numbers); and the scratch a caller killed together with its
guard left is swept by the next process that starts an NVRTC worker, and only that scratch. The guard's main work
(a killed caller leaves no compiler and no scratch) is shown in test_forked_compile.py and test_compile.py."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

import fresh_process
from jax_mosaic_ffi.toolchain import forked_compile
from jax_mosaic_ffi.toolchain import lifeline
from jax_mosaic_ffi.toolchain import lifeline_guard


def _wait_until(done) -> bool:
  deadline = time.monotonic() + fresh_process.INNER_GUARD_S  # a guard: each waits for something that acts at once
  while not done() and time.monotonic() < deadline:
    time.sleep(0.01)
  return done()


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
  except OSError:
    return False


def test_one_guard_watches_every_compile_of_a_process_and_a_killed_one_is_replaced():
  for _ in range(3):
    assert forked_compile.run(lambda: b"done", fresh_process.INNER_GUARD_S) == b"done"
    first = lifeline.guard_pid()
    assert first is not None and _alive(first)
  assert lifeline.guard_pid() == first  # one guard, not one per compile
  with open(f"/proc/{first}/cmdline", "rb") as f:
    assert f.read().split(b"\0")[-2].endswith(b"lifeline_guard.py")
  assert os.getsid(first) == first  # a session of its own: a Ctrl-C at the terminal does not reach it
  os.kill(first, signal.SIGKILL)
  assert _wait_until(lambda: not _alive(first))
  assert forked_compile.run(lambda: b"again", fresh_process.INNER_GUARD_S) == b"again"
  assert lifeline.guard_pid() not in (None, first) and _alive(lifeline.guard_pid())


def _guard_program():
  """The guard program, started as lifeline.py starts it, and our end of its input."""
  ours, theirs = socket.socketpair()
  guard = subprocess.Popen([sys.executable, "-I", "-S", lifeline_guard.__file__], stdin=theirs.fileno(),
                           start_new_session=True)
  theirs.close()
  return guard, ours


def test_the_guard_kills_only_groups_and_removes_only_our_own_folders(tmp_path):
  sleeper = subprocess.Popen(["sleep", str(int(fresh_process.HANG_GUARD_S))], process_group=0)
  bystander = subprocess.Popen(["sleep", str(int(fresh_process.HANG_GUARD_S))], process_group=0)
  ours, kept, target = tmp_path / "ours", tmp_path / "kept", tmp_path / "target"
  for folder in (ours, kept, target):
    folder.mkdir()
    (folder / "a file").write_text("x")
  link = tmp_path / "link"
  link.symlink_to(target)
  inside = ours / "link inside"
  inside.symlink_to(target)
  guard, end = _guard_program()
  try:
    end.sendall(b"".join(r + b"\0" for r in (
        b"+g%d" % sleeper.pid, b"+g%d" % bystander.pid, b"-g%d" % bystander.pid,  # told, then untold
        b"+g0", b"+g1", b"+g-5", b"+gabc", b"+g" + b"9" * 30,  # not groups
        b"+g%d" % os.getpgrp(),  # its caller's own: never killed (this test's)
        b"+f" + bytes(ours), b"+f" + bytes(link), b"+f" + bytes(kept), b"-f" + bytes(kept),
        b"+frelative", b"+f" + b"/x" * 5000, b"?? unknown")))
  finally:
    end.close()  # as when the caller dies
  try:
    assert guard.wait(timeout=fresh_process.INNER_GUARD_S) == 0
    assert sleeper.wait(timeout=fresh_process.INNER_GUARD_S) == -signal.SIGKILL
    assert bystander.poll() is None  # untold: not killed
  finally:
    bystander.kill()
    bystander.wait()
  assert not ours.exists()  # removed, without following the symlink inside it
  assert link.is_symlink() and (target / "a file").exists()  # a symlink is not our folder
  assert (kept / "a file").exists()


def test_the_guard_leaves_a_folder_of_another_user(tmp_path):
  if os.geteuid() != 0:
    pytest.skip("making a folder another user owns needs root")
  theirs = tmp_path / "theirs"
  theirs.mkdir()
  os.chown(theirs, 54321, 54321)
  guard, end = _guard_program()
  end.sendall(b"+f" + bytes(theirs) + b"\0")
  end.close()
  assert guard.wait(timeout=fresh_process.INNER_GUARD_S) == 0
  assert theirs.is_dir()


# A caller whose NVRTC worker runs, killed with its guard (and the worker): nothing of it runs to remove the
# worker's scratch folder.
KILLED_WITH_ITS_GUARD = """
  import json, threading
  import fresh_process, jax_mosaic_ffi as jmf, kernel_sources
  from jax_mosaic_ffi.cuda.nvrtc import worker
  from jax_mosaic_ffi.toolchain import lifeline
  jmf.cuda_kernel(kernel_sources.ADD, "add")
  print(json.dumps([worker._worker._process.pid, worker._worker._scratch, lifeline.guard_pid()]), flush=True)
  threading.Event().wait(float(fresh_process.INNER_GUARD_S))
"""

NEXT = """
  import glob, json, os, tempfile
  import jax_mosaic_ffi as jmf, kernel_sources
  from jax_mosaic_ffi.cuda.nvrtc import worker
  jmf.cuda_kernel(kernel_sources.ADD.replace("add", "add2"), "add2")  # its worker's start sweeps
  print(json.dumps([worker._worker._scratch, sorted(glob.glob(os.path.join(tempfile.gettempdir(), "*")))]))
"""


def test_an_nvrtc_workers_scratch_left_by_a_caller_killed_with_its_guard_is_swept_at_the_next_start(tmp_path):
  temp = tmp_path / "tmp"
  temp.mkdir()
  env = {"TMPDIR": str(temp), "JAX_MOSAIC_FFI_CACHE_DIR": "off",
         "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S": str(fresh_process.INNER_GUARD_S)}
  caller = fresh_process.start(KILLED_WITH_ITS_GUARD, env=env)
  try:
    worker, scratch, guard = json.loads(caller.stdout.readline())
    os.kill(guard, signal.SIGKILL)  # the guard first: it acts when the caller dies
    assert _wait_until(lambda: not _alive(guard))
  finally:
    caller.kill()
    caller.communicate(timeout=fresh_process.HANG_GUARD_S)
  assert _wait_until(lambda: not _alive(worker))  # the worker ends when its input closes
  assert os.path.isdir(scratch)  # left: no one of its process ran to remove it
  mine, found = fresh_process.run(NEXT, env=env).result
  assert not os.path.exists(scratch)
  assert found == [mine] and mine.startswith(str(temp / "jmf-nvrtc-"))  # the new worker's folder, its run over


def test_the_sweep_removes_only_our_own_folders_of_owners_gone(tmp_path, monkeypatch):
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  live = lifeline.scratch_folder("jmf-nvrtc-")  # this process's: its owner lives
  namespace = os.stat("/proc/self/ns/pid").st_ino
  gone = tmp_path / f"jmf-nvrtc-{namespace}.{os.getpid()}.1-00000001"  # our pid, another process's start: gone
  elsewhere = tmp_path / f"jmf-nvrtc-{namespace + 1}.{os.getpid()}.1-00000002"  # a pid namespace we cannot see
  unnamed = tmp_path / "jmf-nvrtc-abcdefgh"  # not named with its owner (an older version's): unknown
  other_prefix = tmp_path / f"jmf-compile-{namespace}.{os.getpid()}.1-00000003"
  target = tmp_path / "target"
  for folder in (gone, elsewhere, unnamed, other_prefix, target):
    folder.mkdir()
  link = tmp_path / f"jmf-nvrtc-{namespace}.{os.getpid()}.1-00000004"
  link.symlink_to(target)
  try:
    assert lifeline.sweep("jmf-nvrtc-") == [str(gone)]
    kept = (elsewhere, unnamed, other_prefix, target, link)
    assert sorted(os.listdir(tmp_path)) == sorted([p.name for p in kept] + [os.path.basename(live)])
    gone.mkdir()
    assert lifeline.sweep("jmf-nvrtc-") == []  # once per process and folder
  finally:
    lifeline.remove_folder(live)


def test_a_compiles_child_is_reaped_and_its_folder_removed_after_its_answer(tmp_path, monkeypatch):
  # Off the caller's path (the answer comes first), but done: no zombie, no folder, in this process as at its exit.
  monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
  answers = [forked_compile.run(lambda: f"{os.getpid()} {tempfile.gettempdir()}".encode(),
                                fresh_process.INNER_GUARD_S).decode().split() for _ in range(3)]
  for pid, scratch in answers:
    assert scratch.startswith(str(tmp_path / "jmf-compile-"))
    assert _wait_until(lambda: not os.path.exists(f"/proc/{pid}") and not os.path.exists(scratch))


EXITS_AFTER_ITS_COMPILES = """
  import json, os, tempfile
  from jax_mosaic_ffi.toolchain import forked_compile
  print(json.dumps([forked_compile.run(lambda: tempfile.gettempdir().encode(), 60).decode() for _ in range(5)]))
"""


def test_a_process_that_exits_after_its_compiles_leaves_no_folder(tmp_path):
  r = fresh_process.run(EXITS_AFTER_ITS_COMPILES, env={"TMPDIR": str(tmp_path)})
  assert len(r.result) == 5 and all(s.startswith(str(tmp_path / "jmf-compile-")) for s in r.result)
  assert not list(tmp_path.iterdir())
