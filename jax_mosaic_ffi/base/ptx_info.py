"""Reading what a PTX text declares: its target, each entry's parameters and the source line of each of its lines.

Knowing the parameter sizes lets ``mosaic_kernel`` check at trace time that the
arguments it passes match the kernel's signature, instead of the GPU reading
garbage at run time. The source lines (`source_lines`, from the PTX's ``.loc``
and ``.file`` directives) let a ptxas error name the line of the user's file.
"""

from __future__ import annotations

import re

_TARGET_RE = re.compile(r"^\s*\.target\s+([\w,\s]+)$", re.MULTILINE)
_ENTRY_RE = re.compile(r"\.entry\s+([\w$.]+)\s*\(([^)]*)\)", re.DOTALL)
_PARAM_RE = re.compile(
    r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+"
    r"(?:\.ptr(?:\s+\.(?:global|const|shared|local))?(?:\s+\.align\s+\d+)?\s+)?"
    r"([\w$]+)(?:\[(\d+)\])?")
_TYPE_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8, "128": 16}
_LOC_RE = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\b")
# `.file 1 "/dir/k.py"`, or the folder and the name apart (`.file 1 "/dir" "k.py"`), perhaps with a time and size.
_FILE_RE = re.compile(r'^\s*\.file\s+(\d+)\s+"((?:[^"\\]|\\.)*)"(?:\s+"((?:[^"\\]|\\.)*)")?')


def target_arch(ptx: str) -> str | None:
  """The first ``.target`` of a PTX text, e.g. 'sm_90a'."""
  match = _TARGET_RE.search(ptx)
  if not match:
    return None
  return match.group(1).split(",")[0].strip()


def entries(ptx: str) -> dict[str, tuple[int, ...]]:
  """Maps each kernel entry of a PTX text to the byte size of its parameters."""
  result = {}
  for match in _ENTRY_RE.finditer(ptx):
    sizes = []
    for param in _PARAM_RE.finditer(match.group(2)):
      _, ptx_type, _, count = param.groups()
      width = _TYPE_SIZES.get(re.sub(r"\D", "", ptx_type) or "", None)
      if width is None:
        width = 1
      sizes.append(width * (int(count) if count else 1))
    result[match.group(1)] = tuple(sizes)
  return result


def source_lines(ptx: str, ptx_lines, count_directives: bool = True) -> dict[int, tuple[str, int]]:
  """For each line number of ``ptx_lines`` (1-based, as ptxas names them), the file and line of the last ``.loc``
  before it, by its ``.file``; lines before any ``.loc`` (or after one of line 0) are left out.
  ``count_directives``: whether ptxas read the ``.loc`` and ``.file`` lines too (False: it read the same PTX made
  without line info).

    >>> source_lines('.entry k(\\n{\\n.loc 1 4 3\\nbogus.b32 %f1;\\n}\\n.file 1 "/tmp/k.py"\\n', [4])
    {4: ('/tmp/k.py', 4)}
  """
  text_lines = ptx.splitlines()
  files: dict[int, str] = {}
  for text in text_lines:
    match = _FILE_RE.match(text)
    if match:
      folder, name = match.group(2), match.group(3)
      files[int(match.group(1))] = folder if name is None else f"{folder.rstrip('/')}/{name}"
  wanted = set(ptx_lines)
  found: dict[int, tuple[str, int]] = {}
  counted = 0
  last = None
  for text in text_lines:
    loc = _LOC_RE.match(text)
    directive = loc is not None or _FILE_RE.match(text) is not None
    if directive and not count_directives:
      last = (int(loc.group(1)), int(loc.group(2))) if loc else last
      continue
    counted += 1
    if counted in wanted and last is not None and last[1] > 0 and last[0] in files:
      found[counted] = (files[last[0]], last[1])
    if loc:
      last = (int(loc.group(1)), int(loc.group(2)))
  return found
