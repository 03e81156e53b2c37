"""Reading what a PTX text declares: its target and each entry's parameters.

Knowing the parameter sizes lets ``mosaic_kernel`` check at trace time that the
arguments it passes match the kernel's signature, instead of the GPU reading
garbage at run time.
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
