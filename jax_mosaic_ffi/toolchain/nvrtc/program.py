"""One NVRTC compile, in this process or in a child process with a time bound.

NVRTC cannot be interrupted: a template that explodes keeps it busy for
minutes, and Ctrl-C does not reach it. So by default compiles run in a
worker process (this file run as a script), kept alive between compiles and
killed when one takes longer than ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``
seconds (default 300, at most a week) or the caller is interrupted. Set it
to 0 to compile in the calling process, with no bound. The worker answers on
a pipe of its own, not its stdout, so whatever the child prints (a
``sitecustomize``, a library) cannot garble an answer.

Each compile also reports the files NVRTC read (``deps``), from NVRTC's own
time trace, for the compile cache to revalidate (``file_deps``).

This file imports nothing from jax_mosaic_ffi, and nothing but the standard
library and cuda-python's NVRTC bindings, so the child starts in tens of
milliseconds.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import pickle
import re
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import threading
import time

TIMEOUT_ENV = "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0
# Longer bounds are taken as this one: select() cannot wait 1e10 s (OverflowError).
MAX_TIMEOUT_S = 7 * 24 * 3600.0
# NVRTC's time trace of one compile; a template-heavy one is a few MiB.
_MAX_TRACE_BYTES = 256 << 20
_MAX_REPLY_BYTES = 1 << 30


class NvrtcFailure(Exception):
  """NVRTC refused the source; ``log`` is its log."""

  def __init__(self, log: str):
    super().__init__(log)
    self.log = log


class NvrtcTimeout(Exception):
  pass


def timeout_s() -> float | None:
  """The bound from the environment; None means: compile in this process."""
  value = os.environ.get(TIMEOUT_ENV, "").strip()
  if not value:
    return DEFAULT_TIMEOUT_S
  try:
    seconds = float(value)
  except ValueError:
    raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds (0 for no bound), got {value!r}") from None
  if not 0 <= seconds < float("inf"):  # nan too
    raise ValueError(f"{TIMEOUT_ENV} must be a finite number of seconds >= 0 (0 compiles in this process, with "
                     f"no bound), got {value!r}")
  return None if seconds == 0 else min(seconds, MAX_TIMEOUT_S)


def _nvrtc():
  try:
    from cuda.bindings import nvrtc
  except ImportError as e:
    raise RuntimeError(
        "jax_mosaic_ffi compiles CUDA C++ with NVRTC through cuda-python; install "
        "it with `pip install cuda-bindings nvidia-cuda-nvrtc`") from e
  return nvrtc


def _check(nvrtc, err, what: str) -> None:
  if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
    _, text = nvrtc.nvrtcGetErrorString(err)
    raise RuntimeError(f"{what} failed: {text.decode() if isinstance(text, bytes) else text}")


def _log(nvrtc, prog) -> str:
  err, size = nvrtc.nvrtcGetProgramLogSize(prog)
  if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
    return ""
  log = b" " * size
  nvrtc.nvrtcGetProgramLog(prog, log)
  return log.rstrip(b"\0").decode(errors="replace")


# Programmatic dependent launch (PDL) lets a kernel start while the one
# before it on the stream finishes, hiding launch latency; it is safe when
# the kernel touches no memory before `griddepcontrol.wait`, which waits for
# the prerequisite grid to complete and its writes to be visible. Kernels we
# compile get that wait as their first instruction, so they can be launched
# with PDL by default; then `griddepcontrol.launch_dependents` lets the next
# kernel start its own launch (it waits likewise before reading anything).
# Hopper (sm_90) and newer only.
PDL_MIN_ARCH = 90
PDL_ENTRY = ("\n\tgriddepcontrol.wait;  // jax_mosaic_ffi: PDL-safe entry"
             "\n\tgriddepcontrol.launch_dependents;")


def _entry_body(ptx: str, symbol: str) -> tuple[int, int] | None:
  """The [start, end) of the body of entry `symbol`, inside its braces."""
  match = re.search(rf"\.entry\s+{re.escape(symbol)}\s*\(", ptx)
  if match is None:
    return None
  params_end = ptx.find(")", match.end())
  start = ptx.find("{", params_end) if params_end >= 0 else -1
  if start < 0:
    return None
  depth = 0
  for index in range(start, len(ptx)):
    depth += {"{": 1, "}": -1}.get(ptx[index], 0)
    if depth == 0:
      return start + 1, index
  return None


def wait_at_entry(ptx: str, symbol: str) -> tuple[str, bool]:
  """(PTX with `PDL_ENTRY` first in `symbol`'s body, whether the entry is
  PDL-safe). An entry that already uses griddepcontrol manages PDL itself
  and is left as written (safe when it waits)."""
  body = _entry_body(ptx, symbol)
  if body is None:
    return ptx, False
  start, end = body
  if "griddepcontrol" in ptx[start:end]:
    return ptx, "griddepcontrol.wait" in ptx[start:end]
  return ptx[:start] + PDL_ENTRY + ptx[start:], True


def _arch_number(target: str) -> int:
  return int(re.sub(r"\D", "", target) or 0)


def _jitlink_options(options) -> list[str]:
  """The NVRTC options that act on the PTX-to-cubin step, as nvJitLink spells them."""
  out = []
  options = list(options)
  for index, option in enumerate(options):
    if option in ("-lineinfo", "--generate-line-info"):
      out.append("-lineinfo")
    elif option in ("-G", "--device-debug"):
      out.append("-g")
    elif re.match(r"^-{1,2}maxrregcount=", option):
      out.append("-maxrregcount=" + option.split("=", 1)[1])
    elif option.startswith("--ptxas-options="):
      out.append("-Xptxas=" + option.split("=", 1)[1])
    elif option in ("-Xptxas", "--ptxas-options") and index + 1 < len(options):
      out.append("-Xptxas=" + options[index + 1])
  return out


def _link_ptx(ptx: bytes, target: str, name: str, nvrtc_options) -> bytes:
  """A cubin for `target` from PTX, with nvJitLink (cuda-python), as NVRTC's own would be built."""
  try:
    from cuda.bindings import nvjitlink
  except ImportError as e:
    raise RuntimeError("jax_mosaic_ffi builds PDL-safe kernels with nvJitLink; install it with "
                       "`pip install nvidia-nvjitlink`, or compile with pdl=False") from e
  options = [f"-arch={target}", "-O3", *_jitlink_options(nvrtc_options)]
  handle = nvjitlink.create(len(options), options)
  try:
    try:
      nvjitlink.add_data(handle, nvjitlink.InputType.PTX, ptx, len(ptx), name)
      nvjitlink.complete(handle)
    except nvjitlink.nvJitLinkError as e:
      log = bytearray(nvjitlink.get_error_log_size(handle))
      nvjitlink.get_error_log(handle, log)
      raise NvrtcFailure(f"nvJitLink could not build the PDL-safe kernel: {e}\n"
                         f"{bytes(log).rstrip(b'\0').decode(errors='replace')}") from None
    cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
    nvjitlink.get_linked_cubin(handle, cubin)
    return bytes(cubin)
  finally:
    nvjitlink.destroy(handle)


def _ptx_of(nvrtc, prog) -> bytes:
  err, size = nvrtc.nvrtcGetPTXSize(prog)
  _check(nvrtc, err, "nvrtcGetPTXSize")
  text = b" " * size
  _check(nvrtc, nvrtc.nvrtcGetPTX(prog, text)[0], "nvrtcGetPTX")
  return text.rstrip(b"\0")


def _headers_read(trace_path: str) -> list[str] | None:
  """The files NVRTC's time trace says it processed, or None if there is no trace to read."""
  try:
    with open(trace_path, "rb") as f:
      data = f.read(_MAX_TRACE_BYTES + 1)
    events = json.loads(data)["traceEvents"] if len(data) <= _MAX_TRACE_BYTES else None
    return [str(e["args"]["detail"]) for e in events if e.get("name") == "Processing Header File"]
  except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
    return None


def compile_here(request: dict, scratch: str | None = None) -> dict:
  """Compiles ``request`` (source, filename, name, headers, options, targets,
  pdl) for each target: {"symbol", "cubins": [bytes per target], "ptx":
  bytes of the first target, "pdl_wait": every image waits at entry, "deps":
  the files read, as NVRTC named them (None if it did not say)}. Raises
  NvrtcFailure with the log. ``scratch``: a private folder for NVRTC's trace
  files (default: a temporary one)."""
  if scratch is not None:
    return _compile_targets(request, scratch)
  with tempfile.TemporaryDirectory(prefix="jmf-nvrtc-") as scratch:
    return _compile_targets(request, scratch)


def _compile_targets(request: dict, scratch: str) -> dict:
  nvrtc = _nvrtc()
  headers = request["headers"]
  cubins = []
  ptx = b""
  symbol = None
  deps: set[str] | None = set()
  pdl_wait = bool(request.get("pdl")) and all(_arch_number(t) >= PDL_MIN_ARCH for t in request["targets"])
  for index, target in enumerate(request["targets"]):
    err, prog = nvrtc.nvrtcCreateProgram(request["source"].encode(), request["filename"].encode(), len(headers),
                                         [v.encode() for v in headers.values()], [k.encode() for k in headers])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
      _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, request["name"].encode())[0], "nvrtcAddNameExpression")
      # NVRTC names each header it reads in its time trace (it adds ".json" to the name): the
      # compile cache's dependencies. Per target, as includes may depend on __CUDA_ARCH__.
      trace = os.path.join(scratch, f"trace{index}")
      with contextlib.suppress(OSError):
        os.unlink(trace + ".json")  # an earlier compile's, which must not pass for this one's
      options = [o.encode() for o in request["options"]] + [f"--gpu-architecture={target}".encode(),
                                                             f"--fdevice-time-trace={trace}".encode()]
      (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
      log = _log(nvrtc, prog)
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcFailure(log or str(err))
      read = _headers_read(trace + ".json")
      deps = None if deps is None or read is None else deps | {h for h in read if h not in headers}
      err, lowered = nvrtc.nvrtcGetLoweredName(prog, request["name"].encode())
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or not lowered:
        raise NvrtcFailure(f"'{request['name']}' does not name a __global__ function in {request['filename']}")
      symbol = lowered.decode()
      target_ptx = _ptx_of(nvrtc, prog)
      cubin = None
      if pdl_wait:
        text, pdl_wait = wait_at_entry(target_ptx.decode(), symbol)
        if text.encode() != target_ptx:  # instrumented here: build the cubin from it
          target_ptx = text.encode()
          cubin = _link_ptx(target_ptx, target, request["filename"], request["options"])
      if cubin is None:
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        _check(nvrtc, err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin)[0], "nvrtcGetCUBIN")
      cubins.append(cubin)
      if index == 0:
        ptx = target_ptx
    finally:
      nvrtc.nvrtcDestroyProgram(prog)
  return {"symbol": symbol, "cubins": cubins, "ptx": ptx, "pdl_wait": pdl_wait,
          "deps": sorted(deps) if deps is not None else None}


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
    self._lock = threading.Lock()

  def _start(self) -> None:
    read_end, write_end = os.pipe()
    self._scratch = tempfile.mkdtemp(prefix="jmf-nvrtc-")
    try:
      self._process = subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__), str(write_end),
                                        self._scratch], stdin=subprocess.PIPE, pass_fds=(write_end,))
    except BaseException:
      os.close(read_end)
      self._remove_scratch()
      raise
    finally:
      os.close(write_end)
    self._answers = os.fdopen(read_end, "rb", buffering=0)

  def compile(self, request: dict, seconds: float) -> dict:
    with self._lock:
      if self._process is None or self._process.poll() is not None:
        self._stop()
        self._start()
      try:
        # The worker started in some earlier working directory: NVRTC resolves
        # relative include paths against the caller's current one.
        _write_message(self._process.stdin, {**request, "cwd": _cwd()})
        status, payload = _read_message(self._answers, time.monotonic() + seconds)
      except BaseException:
        self._stop()
        raise
    if status == "failure":
      raise NvrtcFailure(payload)
    if status == "error":
      raise RuntimeError(payload)
    return payload

  def _stop(self) -> None:
    process, self._process = self._process, None
    answers, self._answers = self._answers, None
    if process is not None:
      process.kill()
      process.wait()
      process.stdin.close()
    if answers is not None:
      answers.close()
    self._remove_scratch()

  def _remove_scratch(self) -> None:
    scratch, self._scratch = self._scratch, None
    if scratch is not None:
      shutil.rmtree(scratch, ignore_errors=True)

  def close(self) -> None:
    """Ends the worker: it exits when its input closes."""
    process, self._process = self._process, None
    answers, self._answers = self._answers, None
    if process is not None:
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


_worker = _Worker()
atexit.register(_worker.close)


def compile_bounded(request: dict, seconds: float | None) -> dict:
  """`compile_here` in the worker process, stopped after ``seconds``; in this process when None."""
  if seconds is None:
    return compile_here(request)
  return _worker.compile(request, seconds)


_LENGTH = struct.Struct("<Q")


def _write_message(stream, message) -> None:
  data = pickle.dumps(message)
  stream.write(_LENGTH.pack(len(data)) + data)
  stream.flush()


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
  chunks = []
  while size > 0:
    if deadline is not None:
      remaining = deadline - time.monotonic()
      if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
        raise NvrtcTimeout(
            f"NVRTC did not finish within the {TIMEOUT_ENV} bound and was stopped. Set it higher to allow "
            "longer compiles (0: no bound)")
    chunk = os.read(fd, min(size, 1 << 20))
    if not chunk:
      raise RuntimeError("the NVRTC worker process died (see its output above)")
    chunks.append(chunk)
    size -= len(chunk)
  return b"".join(chunks)


def _read_message(stream, deadline: float | None):
  fd = stream.fileno()
  (length,) = _LENGTH.unpack(_read_exactly(fd, _LENGTH.size, deadline))
  if length > _MAX_REPLY_BYTES:
    raise RuntimeError(f"the NVRTC worker sent a reply of {length} bytes")
  return pickle.loads(_read_exactly(fd, length, deadline))  # our own child's reply


def _serve(answer_fd: int, scratch: str) -> None:
  """The worker's loop: a request in on stdin, a reply out on `answer_fd`, until stdin closes."""
  stdin = sys.stdin.buffer
  answers = os.fdopen(answer_fd, "wb")
  while True:
    header = stdin.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
      return
    request = pickle.loads(stdin.read(_LENGTH.unpack(header)[0]))
    try:
      if request.get("cwd"):
        os.chdir(request["cwd"])
      reply = ("ok", compile_here(request, scratch))
    except NvrtcFailure as e:
      reply = ("failure", e.log)
    except Exception as e:  # reported by the parent with the kernel's name
      reply = ("error", f"{type(e).__name__}: {e}")
    _write_message(answers, reply)


if __name__ == "__main__":
  _serve(int(sys.argv[1]), sys.argv[2])
