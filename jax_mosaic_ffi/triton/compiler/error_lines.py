"""What a Triton (or Gluon) compile that failed says of the user's lines: each position its error names, as a line
of the ``@triton.jit`` function's file, shown.

Three kinds of position, each taken to the file's line: the frontend's ``CompilationError`` names a line of the
function's source (``at 4:13``), counted from its ``def``; ptxas names a line of the PTX Triton wrote to a
temporary file (``/tmp/.../tmpab12.ptx, line 46``), which Triton removes only after a success, so it is still
there when the error is built (in a bounded compile's child, in that child's own temporary folder), and whose
``.loc`` directives name the function's lines; an MLIR pass names the file's line itself (``/a/k.py:17:5``).
Only on the error path; what cannot be found is left out, never guessed.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile

from jax_mosaic_ffi.base import ptx_info
from jax_mosaic_ffi.base import source_origin

_MAX_DECORATOR_LINES = 16
_PTXAS_LINE = re.compile(r"^ptxas[\w.-]*\s+(\S+\.ptx), line (\d+);", re.MULTILINE)
_MAX_NAMED = 5
_MAX_PTX_BYTES = 64 << 20


def excerpts(fn, error: BaseException, log: str) -> list[str]:
  """The lines of "source lines named above" for Triton's ``error`` (its text and what its passes printed:
  ``log``) in compiling ``fn``: each position it names, as a line of the user's file."""
  out: list[str] = []
  shown: set[source_origin.Place] = set()

  def add(place: source_origin.Place | None, label: str = "") -> None:
    if place is not None and place not in shown and len(shown) < _MAX_NAMED:
      shown.add(place)
      out.extend(place.excerpt(label))

  add(*_frontend_place(fn, error))
  for ptx_path, lines in _ptxas_lines(log).items():
    ptx = _read_temporary(ptx_path)
    if ptx is None:
      continue
    for ptx_line, (path, number) in sorted(ptx_info.source_lines(ptx, lines).items()):
      add(source_origin.line_of(path, number), f"ptx line {ptx_line}")
  for place in source_origin.places_in(log):
    add(place)
  return out


def _frontend_place(fn, error: BaseException) -> tuple[source_origin.Place | None, str]:
  """The file's line of a ``CompilationError``'s ``at LINE:COL`` in ``fn``'s source (a helper's source: not
  known here), checked against that source's own line."""
  node, src = getattr(error, "node", None), getattr(error, "src", None)
  line = getattr(node, "lineno", None)
  if not isinstance(line, int) or not isinstance(src, str) or src != getattr(fn, "src", None):
    return None, ""
  wanted = src.split("\n")[line - 1].strip() if 1 <= line <= src.count("\n") + 1 else ""
  path = getattr(getattr(fn, "fn", None), "__code__", None)
  if not wanted or path is None:
    return None, ""
  # The def's line in the file (Triton >= 3.3: def_file_line_number; before it, starting_line_number is the first
  # decorator's line, and the def follows the decorators).
  for start in {getattr(fn, "def_file_line_number", None),
                _def_line(path.co_filename, getattr(fn, "starting_line_number", None))}:
    if isinstance(start, int):
      place = source_origin.line_of(path.co_filename, start + line - 1)
      if place is not None and place.text.strip() == wanted:
        return place, f"at {line}:{getattr(node, 'col_offset', 0)}"
  return None, ""


def _def_line(filename: str, start) -> int | None:
  """The line of the ``def`` at or after ``start`` (a decorator's line) in ``filename``, or None."""
  if not isinstance(start, int):
    return None
  for number in range(start, start + _MAX_DECORATOR_LINES):
    place = source_origin.line_of(filename, number)
    if place is None:
      return None
    if place.text.lstrip().startswith(("def ", "async def ")):
      return number
  return None


def _ptxas_lines(log: str) -> dict[str, list[int]]:
  """{the PTX file ptxas read: the lines its errors name}."""
  found: dict[str, set[int]] = {}
  for path, line in _PTXAS_LINE.findall(log):
    found.setdefault(path, set()).add(int(line))
  return {path: sorted(lines)[:_MAX_NAMED] for path, lines in found.items()}


def _read_temporary(path: str) -> str | None:
  """The PTX file Triton wrote for ptxas, read only where Triton writes it (directly in this process's temporary
  folder: a bounded compile's child has one of its own), a regular file of this user's, bounded; else None."""
  try:
    if os.path.dirname(os.path.realpath(path)) != os.path.realpath(tempfile.gettempdir()):
      return None
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
  except OSError:
    return None
  try:
    status = os.fstat(fd)
    if not stat.S_ISREG(status.st_mode) or status.st_uid != os.getuid() or status.st_size > _MAX_PTX_BYTES:
      return None
    with os.fdopen(fd, "rb", closefd=False) as f:
      return f.read(_MAX_PTX_BYTES).decode(errors="replace")
  except OSError:
    return None
  finally:
    os.close(fd)
