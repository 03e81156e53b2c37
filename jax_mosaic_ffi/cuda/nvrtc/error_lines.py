"""What an NVRTC compile that failed says: the line that made the kernel, and each position the log names as a
line of the user's own file.

NVRTC counts ``k.cu(4)`` from the start of the string it was given; ptxas (inside NVRTC) counts ``ptx input, line
30`` in the PTX NVRTC made. The first is found in the user's files through `base/source_origin.py` (the Python file
holding the source as a literal, or a file it was read from). The second is taken back to the source by the PTX's
own line table: the failed request is compiled again to PTX alone (a virtual arch, so ptxas does not run) with
``-lineinfo``, under the same time bound, and the ``.loc`` before that PTX line names the source line; not where
the toolchain failed (`toolchain_failure`: its releases mismatched), which no source line explains. Only on the
error path; what cannot be found is left out, never guessed.
"""

from __future__ import annotations

import re

from jax_mosaic_ffi.base import ptx_info
from jax_mosaic_ffi.base import source_location
from jax_mosaic_ffi.base import source_origin
from jax_mosaic_ffi.base.errors import CompileError
from jax_mosaic_ffi.cuda.nvrtc import program
from jax_mosaic_ffi.cuda.nvrtc import release
from jax_mosaic_ffi.cuda.nvrtc import worker

_MAX_NAMED = 5
_PTXAS_LINE = re.compile(r"^ptxas\b[^\n]*?\bptx input, line (\d+)", re.MULTILINE)
# ptxas refusing the PTX's own release or target: a toolchain's fault, which no line of the source explains.
_TOOLCHAIN_REFUSAL = re.compile(r"\bUnsupported \.(?:version|target)\b")


def compile_error(name: str, log: str, source: str, filename: str, request: dict, timeout: float | None,
                  advice: str | None, message: str | None = None) -> CompileError:
  """The `CompileError` for NVRTC's failure ``log`` of ``request`` (program.compile_here's), naming the user's
  line that called the compile and, for each position the log names, the line of the user's file."""
  if message is not None:  # a mistake known exactly (kernel_names.misnamed), which names the call already
    return CompileError(name, log, source, filename, message=message)
  what = f"kernel '{name}' (called at {source_location.current()})"
  return CompileError(name, log, source, filename, advice, what=what,
                      excerpts=excerpts(log, source, filename, request, timeout))


def excerpts(log: str, source: str, filename: str, request: dict | None, timeout: float | None) -> list[str]:
  """The lines of "source lines named above": each ``filename(N)`` of the log, then each ptxas PTX line, with the
  user's file and line where one holds it."""
  lines = source.splitlines()
  origin = source_origin.Origin(source)
  out = []
  for number in sorted({int(n) for n in re.findall(rf"{re.escape(filename)}\((\d+)\)", log)})[:_MAX_NAMED]:
    if 1 <= number <= len(lines):
      out += _excerpt(f"{filename}({number})", number, lines[number - 1], origin)
  ptx_lines = sorted({int(n) for n in _PTXAS_LINE.findall(log)})[:_MAX_NAMED]
  if ptx_lines and request is not None and not toolchain_failure(log):
    for ptx_line, (path, number) in ptx_source_lines(request, ptx_lines, timeout).items():
      label = f"ptx input line {ptx_line}, {path}({number})"
      if path == filename and 1 <= number <= len(lines):
        out += _excerpt(label, number, lines[number - 1], origin, always=True)
      else:
        text = _header_line(path, number)
        if text is not None:
          out += [f"  {label}:", f"  {number:5d} | {text}"]
  return out


def toolchain_failure(log: str) -> bool:
  """Whether ``log`` failed for the toolchain, not the source: releases that do not work together (release.py
  names them) or ptxas refusing the PTX's release or target. Its ptxas lines are then not mapped: the re-compile
  that maps them costs about a second and finds no line of the user's to blame."""
  return release.advice() is not None or _TOOLCHAIN_REFUSAL.search(log) is not None


def _excerpt(label: str, number: int, text: str, origin: source_origin.Origin, always: bool = False) -> list[str]:
  place = origin.where(number)
  if place is not None:
    return [f"  {label} is {place}:", f"  {place.line:5d} | {place.text}"]
  return [f"  {label}:", f"  {number:5d} | {text}"] if always else [f"  {number:5d} | {text}"]


def _header_line(path: str, number: int) -> str | None:
  """Line ``number`` of a header NVRTC read, or None."""
  try:
    with open(path, encoding="utf-8", errors="replace") as f:
      for index, text in enumerate(f, 1):
        if index == number:
          return text.rstrip("\n")
        if index > number:
          break
  except OSError:
    return None
  return None


def ptx_source_lines(request: dict, ptx_lines: list[int], timeout: float | None) -> dict[int, tuple[str, int]]:
  """{PTX line ptxas named: (the file NVRTC named, its line)}, from ``request`` compiled again to PTX alone with
  its line table; {} where that compile fails too or says nothing of those lines."""
  target = request["targets"][0]
  again = {**request, "targets": [re.sub(r"^sm_", "compute_", target)], "pdl": False, "probe": None,
           "link_libraries": [], "ptx_renames": [],
           "options": [*request["options"], "-lineinfo"]}
  try:
    ptx = worker.compile_bounded(again, timeout)["ptx"].decode(errors="replace")
  except (program.NvrtcFailure, worker.NvrtcTimeout, RuntimeError, OSError, KeyError):
    return {}
  return located(ptx, ptx_lines, request["filename"])


def located(ptx: str, ptx_lines: list[int], filename: str) -> dict[int, tuple[str, int]]:
  """For each line of the PTX ptxas read (``ptx`` without its ``.loc`` and ``.file`` lines), the file and line
  of the last ``.loc`` before it in ``ptx``. The main file is named ``filename``, as NVRTC's own messages name it.

    >>> located('.entry k(\\n{\\n.loc 1 4 3\\nmov.b32.bogus %f1, 1.0;\\n}\\n.file 1 "/tmp/k.cu"\\n', [3], "k.cu")
    {3: ('k.cu', 4)}
  """
  found = ptx_info.source_lines(ptx, ptx_lines, count_directives=False)
  return {line: (filename if path.endswith("/" + filename) or path == filename else path, number)
          for line, (path, number) in found.items()}
