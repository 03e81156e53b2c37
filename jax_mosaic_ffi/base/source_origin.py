"""Where a kernel's source text lives in the user's files, so that a compiler's ``k.cu(4)`` can name ``model.py:17``.

A compiler counts lines from the start of the string it was given; the user wrote that string as a literal in a
Python file, or read it from a file of their own. `Origin.where` finds the line in those files, for an error
message only (never for a key): the files of the user's frames on the stack, the modules that hold the very
string, and the text files beside them and in the working directory. A line is placed where the whole source
occurs in the file, else where the line and the lines around it occur together once (a literal the user formats,
``SOURCE % (...)``, still matches on its other lines). A compiler that names the user's file itself (an MLIR
location ``/home/me/model.py:17:5``, a ``.loc`` of Triton's PTX, a Python traceback) is read at that line: `line_of`,
`places_in`, `raised_at`. Every read is bounded; what cannot be found is None.

    >>> origin = Origin("int x;\\nint y = undefined;\\n", files=[])
    >>> origin.where(2) is None   # no file of the user's holds it
    True
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import re
import sys
import sysconfig
import types

from jax._src import source_info_util

_MAX_FILE_BYTES = 4 << 20
_MAX_FILES = 64
_MAX_FOLDER_ENTRIES = 256
_MAX_FRAMES = 64
# The user's frames of the call a compile made ahead was started from (`seen_from`): its stack, where the compile
# runs on another thread's.
_seen_from: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("jax_mosaic_ffi_seen_from", default=None)
# The lines either side of a line that must agree for a line-by-line match.
_CONTEXT = 4
_TEXT_SUFFIXES = (".cu", ".cuh", ".h", ".hh", ".hpp", ".hxx", ".inl", ".inc", ".cuda", ".c", ".cc", ".cpp", ".cxx",
                  ".ptx", ".txt", ".py")


@dataclasses.dataclass(frozen=True)
class Place:
  """A line of a user's file: its path as shown (relative to the working directory when under it), its number
  and its text."""

  path: str
  line: int
  text: str

  def __str__(self) -> str:
    return f"{self.path}:{self.line}"

  def excerpt(self, label: str = "") -> list[str]:
    """The lines a compile error shows it in: ``"  {label} is {place}:"`` (or ``"  {place}:"``), then the line."""
    return [f"  {label} is {self}:" if label else f"  {self}:", f"  {self.line:5d} | {self.text}"]


def _shown(path: str) -> str:
  try:
    relative = os.path.relpath(path)
  except ValueError:
    return path
  return path if relative.startswith(os.pardir) else relative


def _read(path: str) -> str | None:
  try:
    if not os.path.isfile(path) or os.path.getsize(path) > _MAX_FILE_BYTES:
      return None
    with open(path, encoding="utf-8", errors="replace") as f:
      return f.read(_MAX_FILE_BYTES)
  except OSError:
    return None


def line_of(path: str, number: int) -> Place | None:
  """Line ``number`` of the user's file ``path`` (an absolute path, as compilers name it), or None."""
  if not _user_file(path) or number < 1:
    return None
  text = _read(path)
  lines = [] if text is None else text.splitlines()
  return Place(_shown(path), number, lines[number - 1]) if number <= len(lines) else None


# An absolute path of a Python file and a line: an MLIR location (`loc("/a/k.py":17:5)`, `/a/k.py:17:5: error`).
_POSITION = re.compile(r"(/[^\s:\"'()\x1b]+\.py)\"?:(\d+)\b")
_MAX_PLACES = 5


def places_in(text: str) -> list[Place]:
  """The lines of the user's files that ``text`` (a compiler's log) names by absolute path, a bounded few, each
  once."""
  found: list[Place] = []
  for path, number in dict.fromkeys(_POSITION.findall(text)):
    place = line_of(path, int(number))
    if place is not None and place not in found:
      found.append(place)
      if len(found) == _MAX_PLACES:
        break
  return found


def raised_at(error: BaseException, outside: tuple[str, ...] = ()) -> Place | None:
  """The innermost line of a user's file in ``error``'s traceback, not under a folder of ``outside`` (a
  compiler's own package), the standard library's or the installed packages'; its causes first (the first raised
  is nearest the mistake)."""
  chain: list[BaseException] = []
  while error is not None and error not in chain and len(chain) < 8:
    chain.append(error)
    error = error.__cause__ or error.__context__
  libraries = [sysconfig.get_paths()[name] for name in ("stdlib", "purelib", "platlib")]
  excluded = tuple(os.path.join(os.path.realpath(folder), "") for folder in (*outside, *libraries))
  for raised in reversed(chain):
    frames = []
    tb = raised.__traceback__
    while tb is not None and len(frames) < 1024:
      frames.append((tb.tb_frame.f_code.co_filename, tb.tb_lineno))
      tb = tb.tb_next
    for path, number in reversed(frames):
      if not os.path.realpath(path).startswith(excluded):
        place = line_of(path, number)
        if place is not None:
          return place
  return None


def _user_file(filename) -> bool:
  return (isinstance(filename, str) and not filename.startswith("<") and os.path.isabs(filename)
          and source_info_util.is_user_filename(filename))


def candidate_files(source: str) -> list[str]:
  """The files that may hold ``source``: those of the modules holding the very string, of the user's frames on
  the stack (innermost first), those their variables name, then the text files beside them and in the working
  directory."""
  found: list[str] = []

  def add(path):
    if isinstance(path, str) and path not in found and len(found) < _MAX_FILES:
      found.append(path)

  for module in list(sys.modules.values()):
    filename = getattr(module, "__file__", None)
    if _user_file(filename) and filename not in found:
      try:
        holds = any(value is source for value in list(vars(module).values()))
      except TypeError:
        holds = False
      if holds:
        add(filename)
  named: list[str] = []  # files the user's frames name (a path in a variable): where a source read may come from
  for frame in _seen_from.get() or user_frames():
    add(frame.f_code.co_filename)
    named += _paths_in(frame.f_locals)
  for path in named:
    add(path)
  folders = [os.path.dirname(p) for p in found] + [os.getcwd()]
  for folder in dict.fromkeys(folders):
    try:
      names = sorted(os.listdir(folder))[:_MAX_FOLDER_ENTRIES]
    except OSError:
      continue
    for name in names:
      if name.endswith(_TEXT_SUFFIXES) and not name.startswith("."):
        add(os.path.join(folder, name))
  return found


def user_frames() -> tuple:
  """The frames of the user's files on the calling thread's stack, innermost first, a bounded few."""
  frames = []
  frame = sys._getframe(1)  # noqa: SLF001  (the stack as it is, without reading every frame's source)
  while frame is not None and len(frames) < _MAX_FRAMES:
    if _user_file(frame.f_code.co_filename):
      frames.append(frame)
    frame = frame.f_back
  return tuple(frames)


def traceback_at(frames: tuple) -> types.TracebackType | None:
  """A traceback of one entry, the innermost of ``frames`` at the line it is on now (taken now: the frame runs on):
  what an error of work started there and run elsewhere (a compile made ahead) is raised with, so that its
  traceback ends on the line that started it."""
  if not frames:
    return None
  return types.TracebackType(None, frames[0], frames[0].f_lasti, frames[0].f_lineno)


@contextlib.contextmanager
def seen_from(frames: tuple):
  """Within: `candidate_files` looks at ``frames`` (`user_frames` of the call that started the work) in place of
  the stack."""
  token = _seen_from.set(frames)
  try:
    yield
  finally:
    _seen_from.reset(token)


def _paths_in(variables) -> list[str]:
  """The regular files that a frame's variables name (a str or a path object), a bounded few."""
  out = []
  for value in list(variables.values())[:_MAX_FOLDER_ENTRIES]:
    if isinstance(value, os.PathLike):
      value = os.fspath(value)
    if isinstance(value, str) and 0 < len(value) < 4096 and "\n" not in value and "\0" not in value:
      path = os.path.abspath(value)
      if path.endswith(_TEXT_SUFFIXES) and os.path.isfile(path):
        out.append(path)
  return out[:8]


class Origin:
  """Maps a line of ``source`` (1-based, as a compiler counts it) to a `Place` in ``files`` (default:
  `candidate_files`), reading each file at most once."""

  def __init__(self, source: str, files: list[str] | None = None):
    self.source = source
    self.lines = source.splitlines()
    self._files = files
    self._texts: dict[str, list[str] | None] = {}

  def _candidates(self) -> list[str]:
    if self._files is None:
      self._files = candidate_files(self.source)
    return self._files

  def _file_lines(self, path: str) -> tuple[str | None, list[str]]:
    if path not in self._texts:
      text = _read(path)
      self._texts[path] = None if text is None else [text]
    held = self._texts[path]
    if held is None:
      return None, []
    return held[0], held[0].splitlines()

  def where(self, line: int) -> Place | None:
    """The user's file and line holding line ``line`` of the source, or None where no file holds it once."""
    if not 1 <= line <= len(self.lines) or not self.lines[line - 1].strip():
      return None
    for whole in (True, False):  # a file holding the whole source first, wherever it is in the search
      for path in self._candidates():
        text, file_lines = self._file_lines(path)
        if text is None:
          continue
        at = self._whole(text, line) if whole else self._by_lines(file_lines, line)
        if at is not None and at < len(file_lines):
          return Place(_shown(path), at + 1, file_lines[at])
    return None

  def _whole(self, text: str, line: int) -> int | None:
    """The 0-based file line of ``line`` where the whole source occurs in ``text`` exactly once."""
    if len(self.source.strip()) < 8:
      return None
    start = text.find(self.source)
    if start < 0 or text.find(self.source, start + 1) >= 0:
      return None
    return text.count("\n", 0, start) + line - 1

  def _by_lines(self, file_lines: list[str], line: int) -> int | None:
    """The 0-based file line where source line ``line`` and the most of its neighbours occur together (the line
    itself may differ: a literal the user formats), when one place beats every other and two lines agree there
    (or the source is that one line, found within a line of the file)."""
    wanted = self.lines[line - 1].strip()
    at: dict[str, list[int]] = {}
    for index, text in enumerate(file_lines):
      at.setdefault(text.strip(), []).append(index)
    votes: dict[int, int] = {}
    for offset in range(-_CONTEXT, _CONTEXT + 1):
      mine = line - 1 + offset
      if not 0 <= mine < len(self.lines):
        continue
      near = self.lines[mine].strip()
      if len(near) <= 1 or (offset == 0 and near != wanted):
        continue
      for index in at.get(near, ()):
        if 0 <= index - offset < len(file_lines):
          votes[index - offset] = votes.get(index - offset, 0) + 1
    if len([s for s in self.lines if s.strip()]) == 1:
      votes.update((index, 2) for index, text in enumerate(file_lines) if wanted in text)
    if not votes:
      return None
    ranked = sorted(((score, index) for index, score in votes.items()), reverse=True)
    best, index = ranked[0]
    if best < 2 or (len(ranked) > 1 and ranked[1][0] == best):
      return None
    return index
