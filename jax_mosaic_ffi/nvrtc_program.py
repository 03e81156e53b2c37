"""One NVRTC compile, in this process or in a child process with a time bound.

NVRTC cannot be interrupted: a template that explodes keeps it busy for
minutes, and Ctrl-C does not reach it. So by default compiles run in a
worker process (this file run as a script), kept alive between compiles and
killed when one takes longer than ``JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S``
seconds (default 300) or the caller is interrupted. Set it to 0 to compile
in the calling process, with no bound.

This file imports nothing from jax_mosaic_ffi, and nothing but the standard
library and cuda-python's NVRTC bindings, so the child starts in tens of
milliseconds.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time

TIMEOUT_ENV = "JAX_MOSAIC_FFI_COMPILE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300.0
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
  if seconds != seconds or seconds < 0:
    raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds >= 0 (0 for no bound), got {value!r}")
  return None if seconds == 0 or seconds == float("inf") else seconds


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


def compile_here(request: dict) -> dict:
  """Compiles ``request`` (source, filename, name, headers, options, targets)
  for each target: {"symbol", "cubins": [bytes per target], "ptx": bytes of
  the first target}. Raises NvrtcFailure with the log."""
  nvrtc = _nvrtc()
  headers = request["headers"]
  cubins = []
  ptx = b""
  symbol = None
  for index, target in enumerate(request["targets"]):
    err, prog = nvrtc.nvrtcCreateProgram(request["source"].encode(), request["filename"].encode(), len(headers),
                                         [v.encode() for v in headers.values()], [k.encode() for k in headers])
    _check(nvrtc, err, "nvrtcCreateProgram")
    try:
      _check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, request["name"].encode())[0], "nvrtcAddNameExpression")
      options = [o.encode() for o in request["options"]] + [f"--gpu-architecture={target}".encode()]
      (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
      log = _log(nvrtc, prog)
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcFailure(log or str(err))
      err, lowered = nvrtc.nvrtcGetLoweredName(prog, request["name"].encode())
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or not lowered:
        raise NvrtcFailure(f"'{request['name']}' does not name a __global__ function in {request['filename']}")
      symbol = lowered.decode()
      err, size = nvrtc.nvrtcGetCUBINSize(prog)
      _check(nvrtc, err, "nvrtcGetCUBINSize")
      cubin = b" " * size
      _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin)[0], "nvrtcGetCUBIN")
      cubins.append(cubin)
      if index == 0:
        err, size = nvrtc.nvrtcGetPTXSize(prog)
        _check(nvrtc, err, "nvrtcGetPTXSize")
        text = b" " * size
        _check(nvrtc, nvrtc.nvrtcGetPTX(prog, text)[0], "nvrtcGetPTX")
        ptx = text.rstrip(b"\0")
    finally:
      nvrtc.nvrtcDestroyProgram(prog)
  return {"symbol": symbol, "cubins": cubins, "ptx": ptx}


class _Worker:
  """A child process that compiles requests one after another.

  Kept alive between compiles, so NVRTC's start-up is paid once per process,
  not once per kernel; killed (and replaced on the next compile) when a
  compile runs out of time or the caller is interrupted.
  """

  def __init__(self):
    self._process = None
    self._lock = threading.Lock()

  def compile(self, request: dict, seconds: float) -> dict:
    with self._lock:
      if self._process is None or self._process.poll() is not None:
        self._process = subprocess.Popen([sys.executable, "-P", os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE)
      try:
        _write_message(self._process.stdin, request)
        status, payload = _read_message(self._process.stdout, time.monotonic() + seconds)
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
    if process is not None:
      process.kill()
      process.wait()


_worker = _Worker()


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


def _serve() -> None:
  """The worker's loop: a request in, a reply out, until stdin closes."""
  stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
  while True:
    header = stdin.read(_LENGTH.size)
    if len(header) < _LENGTH.size:
      return
    request = pickle.loads(stdin.read(_LENGTH.unpack(header)[0]))
    try:
      reply = ("ok", compile_here(request))
    except NvrtcFailure as e:
      reply = ("failure", e.log)
    except Exception as e:  # reported by the parent with the kernel's name
      reply = ("error", f"{type(e).__name__}: {e}")
    _write_message(stdout, reply)


if __name__ == "__main__":
  _serve()
