#!/usr/bin/env python3
"""Checks that no file of the package (jax_mosaic_ffi/, Python) or of csrc/ (C++) is over 400 lines: a room that
grows past it holds more than one concept, and is split into named files (docs/architecture.md).
Standard library only, so scripts/lint.sh runs it anywhere:

  python3 scripts/check_file_sizes.py [repo root]
"""

import pathlib
import sys

MAX_LINES = 400
FOLDERS = {"jax_mosaic_ffi": (".py",), "csrc": (".h", ".cc")}


def check(root: pathlib.Path) -> list[str]:
  problems = []
  for folder, suffixes in FOLDERS.items():
    for path in sorted((root / folder).rglob("*")):
      if path.suffix not in suffixes or not path.is_file():
        continue
      lines = len(path.read_text(errors="replace").splitlines())
      if lines > MAX_LINES:
        problems.append(f"{path.relative_to(root)}: {lines} lines, over {MAX_LINES}: split it into named files")
  return problems


def main() -> int:
  root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent)
  problems = check(root)
  for problem in problems:
    print(problem, file=sys.stderr)
  if problems:
    return 1
  print(f"file sizes: no file of jax_mosaic_ffi/ or csrc/ over {MAX_LINES} lines")
  return 0


if __name__ == "__main__":
  sys.exit(main())
