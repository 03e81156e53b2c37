"""The NVRTC worker program: one compile, in whatever process runs it.

Run as a script it is the worker process that `worker.py` starts and bounds in time; imported, its
`compile_here` compiles in the calling process. It answers on a pipe of its own, not its stdout, so
whatever the child prints (a ``sitecustomize``, a library) cannot garble an answer.

Each compile also reports the files NVRTC read (``deps``), for the compile cache to revalidate
(``file_deps``), from the compile itself: its front end's include trace (EDG's ``--trace_includes``,
one line per ``#include``, indented by depth) written into a scratch file (``--error_output``; the
program log keeps its diagnostics). NVRTC 13.0's code is byte for byte the same with the trace on
(unlike its time trace, with which sm_100 and sm_120 code came out in one of two variants per
process), so no second pass is needed, for any target. Each compile gets a fixed ``--frandom-seed``
(unless the options name one): without it NVRTC names internal-linkage symbols (a template kernel's,
CCCL's customization points) with a new random number each time. So the same source, options, NVRTC
and target give the same bytes in every process.

Where the cubin is built from the PTX anyway (the PDL wait added at the entry, or relocatable code
linked with device libraries), NVRTC is asked for the PTX alone (``compute_XX``: the same PTX as
``sm_XX``'s), and nvJitLink runs ptxas once, not NVRTC and then nvJitLink both.

This file imports nothing from jax_mosaic_ffi, and nothing but the standard
library and cuda-python's NVRTC bindings, so the child starts in tens of
milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import struct
import sys
import tempfile

# NVRTC's include trace of one compile: a line per #include (a template-heavy kernel's is a few MiB).
_MAX_TRACE_BYTES = 256 << 20
# NVRTC's own pseudo-files, which its trace names and no disk holds.
_BUILT_IN = frozenset({"__nv_nvrtc_builtin_header.h", "__nv_name_map"})


class NvrtcFailure(Exception):
  """NVRTC refused the source; ``log`` is its log."""

  def __init__(self, log: str):
    super().__init__(log)
    self.log = log


def load_nvrtc():
  try:
    from cuda.bindings import nvrtc  # noqa: PLC0415  (cuda-python's NVRTC, loaded at the first compile: tens of ms)
  except ImportError as e:
    raise RuntimeError(
        "jax_mosaic_ffi compiles CUDA C++ with NVRTC through cuda-python; install "
        "it with `pip install cuda-bindings nvidia-cuda-nvrtc`") from e
  return nvrtc


def check(nvrtc, err, what: str) -> None:
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
# On the line of the body's opening brace: ptxas names lines of the PTX it reads (nvJitLink's, from this PTX), and
# cuda/nvrtc/error_lines.py maps them through the PTX NVRTC made, so the instrumented PTX keeps its line numbers.
PDL_ENTRY = " griddepcontrol.wait; griddepcontrol.launch_dependents;  /* jax_mosaic_ffi: PDL-safe entry */"


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


def _link_ptx(ptx: bytes, target: str, name: str, nvrtc_options, libraries=(), what="the PDL-safe kernel") -> bytes:
  """A cubin for `target` from PTX, with nvJitLink (cuda-python), as NVRTC's own would be built;
  relocatable PTX (-rdc) is linked with the device `libraries` (archives of relocatable cubins)."""
  try:
    from cuda.bindings import nvjitlink  # noqa: PLC0415  (nvJitLink, loaded only for the kernels that need it)
  except ImportError as e:
    raise RuntimeError("jax_mosaic_ffi builds PDL-safe kernels and links device libraries with nvJitLink; "
                       "install it with `pip install nvidia-nvjitlink`") from e
  options = [f"-arch={target}", "-O3", *_jitlink_options(nvrtc_options)]
  handle = nvjitlink.create(len(options), options)
  try:
    try:
      nvjitlink.add_data(handle, nvjitlink.InputType.PTX, ptx, len(ptx), name)
      for library in libraries:
        nvjitlink.add_file(handle, nvjitlink.InputType.LIBRARY, library)
      nvjitlink.complete(handle)
    except nvjitlink.nvJitLinkError as e:
      log = bytearray(nvjitlink.get_error_log_size(handle))
      nvjitlink.get_error_log(handle, log)
      raise NvrtcFailure(f"nvJitLink could not build {what}: {e}\n"
                         f"{bytes(log).rstrip(b'\0').decode(errors='replace')}") from None
    cubin = bytearray(nvjitlink.get_linked_cubin_size(handle))
    nvjitlink.get_linked_cubin(handle, cubin)
    return bytes(cubin)
  finally:
    nvjitlink.destroy(handle)


def _ptx_of(nvrtc, prog) -> bytes:
  err, size = nvrtc.nvrtcGetPTXSize(prog)
  check(nvrtc, err, "nvrtcGetPTXSize")
  text = b" " * size
  check(nvrtc, nvrtc.nvrtcGetPTX(prog, text)[0], "nvrtcGetPTX")
  return text.rstrip(b"\0")


def trace_options(trace_path: str) -> list[str]:
  """NVRTC options that write its include trace (EDG's) into ``trace_path``: the compile's output is unchanged."""
  return ["-Xcudafe", "--trace_includes", "-Xcudafe", f"--error_output={trace_path}"]


def headers_read(trace_path: str) -> list[tuple[str, str | None]] | None:
  """The files NVRTC's include trace says it read, each with the file that included it (None: the source itself,
  or a pre-included file), or None if there is no trace to read. A header is listed one space deeper than its
  includer; one included again (skipped by its guard) is listed again."""
  try:
    with open(trace_path, "rb") as f:
      data = f.read(_MAX_TRACE_BYTES + 1)
  except OSError:
    return None
  if len(data) > _MAX_TRACE_BYTES:
    return None
  read, enclosing = [], []  # enclosing: the includers open at this depth, outermost first
  for line in data.splitlines():
    name = line.lstrip(b" ")
    depth = len(line) - len(name)
    if not name or depth > len(enclosing):
      return None  # not a trace: a header nested deeper than an includer
    del enclosing[depth:]
    path = os.fsdecode(name)
    if path not in _BUILT_IN:
      read.append((path, enclosing[-1] if enclosing else None))
    enclosing.append(path)
  return read


def _seed(request: dict) -> list[str]:
  """A fixed seed for the names NVRTC gives internal-linkage symbols (random by default), unless the options set
  one. The kernel's file name: any fixed value will do, as each module is loaded on its own."""
  if any(o.startswith(("-frandom-seed", "--frandom-seed")) for o in request["options"]):
    return []
  return [f"--frandom-seed={request['filename']}"]


def compile_here(request: dict, scratch: str | None = None) -> dict:
  """Compiles ``request`` (source, filename, name, headers, options, targets,
  pdl, probe: {"source", "expression"} or None, link_libraries: device libraries to link the relocatable
  code with, ptx_renames: (pattern, replacement) pairs applied to the relocatable PTX before the link) for
  each target: {"symbol", "cubins": [bytes per target], "ptx": bytes of the first target, "pdl_wait": every
  image waits at entry, "deps": the files read, as NVRTC named them (None if it did not say),
  "includes": (file read, the file that included it or None for the source), "probe_symbol": the probe's lowered
  name}. Raises
  NvrtcFailure with the log. ``scratch``: a private folder for NVRTC's include
  trace (default: a temporary one)."""
  if scratch is not None:
    return _compile_targets(request, scratch)
  with tempfile.TemporaryDirectory(prefix="jmf-nvrtc-") as scratch:
    return _compile_targets(request, scratch)


def _without_probe_errors(log: str) -> str | None:
  """The log without the errors that name the type probe (`param_types.PROBE_SOURCE`), which repeat the
  user's (a misspelt kernel name fails in both); None when the probe's are the only errors."""
  blocks = [b for b in log.split("\n\n") if "jmf_probe" not in b]
  errors = sum(": error" in b for b in blocks)
  if errors == 0:
    return None
  text = "\n\n".join(blocks)
  return re.sub(r"\d+ errors? detected", f"{errors} error{'s' if errors > 1 else ''} detected", text)


def _compile_targets(request: dict, scratch: str) -> dict:
  """`_compile_all`, with the type probe when asked; a probe that alone fails is dropped (types unknown)."""
  probe = request.get("probe")
  try:
    return _compile_all(request, scratch, probe)
  except NvrtcFailure as e:
    if probe is None or "jmf_probe" not in e.log:
      raise
    user_errors = _without_probe_errors(e.log)
    if user_errors is not None:
      raise NvrtcFailure(user_errors) from None
  return _compile_all(request, scratch, None)


def _compile_all(request: dict, scratch: str, probe: dict | None) -> dict:
  nvrtc = load_nvrtc()
  headers = request["headers"]
  cubins = []
  ptx = b""
  symbol = probe_symbol = None
  deps: set[str] | None = set()
  includes: set[tuple[str, str | None]] = set()
  libraries = list(request.get("link_libraries") or ())
  instrumented = bool(request.get("pdl")) and all(_arch_number(t) >= PDL_MIN_ARCH for t in request["targets"]) \
      and not libraries
  pdl_wait = instrumented
  trace = os.path.join(scratch, "includes.txt")
  for index, target in enumerate(request["targets"]):
    # The probe goes after the user's source, so NVRTC's line numbers stay the user's.
    source = request["source"] + (probe["source"] if probe else "")
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), request["filename"].encode(), len(headers),
                                         [v.encode() for v in headers.values()], [k.encode() for k in headers])
    check(nvrtc, err, "nvrtcCreateProgram")
    try:
      check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, request["name"].encode())[0], "nvrtcAddNameExpression")
      if probe:
        check(nvrtc, nvrtc.nvrtcAddNameExpression(prog, probe["expression"].encode())[0], "nvrtcAddNameExpression")
      # A cubin nvJitLink builds from the PTX needs no ptxas run by NVRTC: the PTX alone (compute_XX).
      arch = target.replace("sm_", "compute_", 1) if libraries or instrumented else target
      with contextlib.suppress(OSError):
        os.unlink(trace)  # an earlier compile's, which must not pass for this one's
      options = [o.encode() for o in [*request["options"], *_seed(request), f"--gpu-architecture={arch}",
                                      *trace_options(trace)]]
      (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), options)
      log = _log(nvrtc, prog)
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcFailure(log or str(err))
      # Per target (includes may depend on __CUDA_ARCH__), from the compile itself.
      read = headers_read(trace)
      deps = None if deps is None or read is None else deps | {h for h, _ in read if h not in headers}
      includes.update((h, by) for h, by in read or () if h not in headers)
      err, lowered = nvrtc.nvrtcGetLoweredName(prog, request["name"].encode())
      if err != nvrtc.nvrtcResult.NVRTC_SUCCESS or not lowered:
        raise NvrtcFailure(f"'{request['name']}' does not name a __global__ function in {request['filename']}")
      symbol = lowered.decode()
      if probe and index == 0:
        err, lowered = nvrtc.nvrtcGetLoweredName(prog, probe["expression"].encode())
        probe_symbol = lowered.decode() if err == nvrtc.nvrtcResult.NVRTC_SUCCESS and lowered else None
      target_ptx = _ptx_of(nvrtc, prog)
      if libraries:  # relocatable code: its calls into the libraries are resolved by the link
        for pattern, replacement in request.get("ptx_renames") or ():
          target_ptx = re.sub(pattern.encode(), replacement.encode(), target_ptx)
        cubin = _link_ptx(target_ptx, target, request["filename"], request["options"], libraries,
                          f"'{request['name']}' with {', '.join(os.path.basename(x) for x in libraries)}")
      elif instrumented:  # the wait first at the entry (unless it manages PDL itself), then the cubin
        text, waits = wait_at_entry(target_ptx.decode(), symbol)
        pdl_wait = pdl_wait and waits
        target_ptx = text.encode()
        cubin = _link_ptx(target_ptx, target, request["filename"], request["options"])
      else:
        err, size = nvrtc.nvrtcGetCUBINSize(prog)
        check(nvrtc, err, "nvrtcGetCUBINSize")
        cubin = b" " * size
        check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin)[0], "nvrtcGetCUBIN")
      cubins.append(cubin)
      if index == 0:
        ptx = target_ptx
    finally:
      nvrtc.nvrtcDestroyProgram(prog)
  return {"symbol": symbol, "cubins": cubins, "ptx": ptx, "pdl_wait": pdl_wait,
          "deps": sorted(deps) if deps is not None else None, "probe_symbol": probe_symbol,
          "includes": sorted(includes, key=lambda pair: (pair[0], pair[1] or ""))}


LENGTH = struct.Struct("<Q")


def write_message(stream, message) -> None:
  data = pickle.dumps(message)
  stream.write(LENGTH.pack(len(data)) + data)
  stream.flush()


def _serve(answer_fd: int, scratch: str) -> None:
  """The worker's loop: a request in on stdin, a reply out on `answer_fd`, until stdin closes."""
  stdin = sys.stdin.buffer
  answers = os.fdopen(answer_fd, "wb")
  while True:
    header = stdin.read(LENGTH.size)
    if len(header) < LENGTH.size:
      return
    request = pickle.loads(stdin.read(LENGTH.unpack(header)[0]))
    try:
      if request.get("cwd"):
        os.chdir(request["cwd"])
      reply = ("ok", compile_here(request, scratch))
    except NvrtcFailure as e:
      reply = ("failure", e.log)
    except Exception as e:  # reported by the parent with the kernel's name
      reply = ("error", f"{type(e).__name__}: {e}")
    write_message(answers, reply)


if __name__ == "__main__":
  _serve(int(sys.argv[1]), sys.argv[2])
