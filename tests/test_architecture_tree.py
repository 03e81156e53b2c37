"""docs/architecture.md's file tree agrees with the tree: every file and folder of jax_mosaic_ffi/ and csrc/ is in
it, and every path in it exists.

The tree is the page's first code block. An entry is a line indented by two spaces a level, whose first word is
a name (a folder ends in ``/``); its comment follows, and comment lines go on in the comment column. A name may
hold a path below its folder (``nvrtc/compiler.py``) and braces (``contract.{h,cc}``: ``contract.h`` and
``contract.cc``). A folder listed without entries below it stands for all it holds (``include/jmf_compat/``), and
a listed folder's ``__init__.py`` (its package docstring) goes with it.
"""

import os
import re
import subprocess

import pytest

import fresh_process

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "architecture.md")
CHECKED = ("jax_mosaic_ffi/", "csrc/")
COMMENT_COLUMN = 27  # where comments go on; an entry starts before it

pytestmark = pytest.mark.skipif(not os.path.exists(PAGE), reason="docs/architecture.md is in a checkout only")


def tree_lines() -> list[str]:
  text = open(PAGE, encoding="utf-8").read()
  block = re.search(r"^```\n(jax_mosaic_ffi/.*?)^```", text, re.S | re.M)
  assert block, "docs/architecture.md: no code block starting with jax_mosaic_ffi/"
  return block.group(1).splitlines()


def expand(name: str) -> list[str]:
  """``contract.{h,cc}`` -> contract.h, contract.cc."""
  braces = re.search(r"\{([^}]*)\}", name)
  if braces is None:
    return [name]
  return [expanded for part in braces.group(1).split(",")
          for expanded in expand(name[:braces.start()] + part + name[braces.end():])]


def entries() -> list[tuple[str, bool]]:
  """Each entry's path from the repository's root, and whether it is a folder listed with nothing below it."""
  found, parents = [], []  # parents: (depth, path) of the folders the current line is in
  lines = tree_lines()
  for number, line in enumerate(lines):
    indent = len(line) - len(line.lstrip(" "))
    if not line.strip() or indent >= COMMENT_COLUMN:
      continue  # a comment going on
    assert indent % 2 == 0, f"architecture.md tree line {number + 1}: an entry is indented by 2 a level: {line!r}"
    depth = indent // 2
    while parents and parents[-1][0] >= depth:
      parents.pop()
    assert len(parents) == depth, f"architecture.md tree line {number + 1}: indented below no folder: {line!r}"
    name = line.split()[0]
    base = parents[-1][1] if parents else ""
    for path in expand(name):
      found.append((base + path, path.endswith("/")))
    if name.endswith("/"):
      parents.append((depth, base + name))
  listed = {path for path, _ in found}
  return [(path, folder and not any(other != path and other.startswith(path) for other in listed))
          for path, folder in found]


def repository_files() -> list[str]:
  """The files of the checked folders: git's, where this is a git checkout, else what is on disk (no build
  outputs)."""
  try:
    out = subprocess.run(["git", "ls-files", "--", *CHECKED], cwd=ROOT, capture_output=True, text=True, check=True,
                         timeout=fresh_process.HANG_GUARD_S).stdout
    files = out.split()
  except (OSError, subprocess.CalledProcessError):
    files = []
  if files:
    return [f for f in files if os.path.exists(os.path.join(ROOT, f))]  # deleted but not yet committed: gone
  return sorted(os.path.relpath(os.path.join(folder, f), ROOT)
                for top in CHECKED for folder, _, names in os.walk(os.path.join(ROOT, top))
                if "__pycache__" not in folder for f in names if not f.endswith((".so", ".pyc")))


def test_every_path_in_the_tree_exists():
  built = {"jax_mosaic_ffi/base/_core.abi3.so"}  # the extension, built into the package's folder by the install
  missing = [path for path, _ in entries()
             if path.startswith(CHECKED) and path not in built and not os.path.exists(os.path.join(ROOT, path))]
  assert not missing, f"docs/architecture.md's tree names paths that do not exist: {missing}"


def test_every_file_and_folder_is_in_the_tree():
  listed = entries()
  names = {path for path, _ in listed}
  whole = [path for path, whole in listed if whole]
  absent = []
  for path in repository_files():
    folder, base = os.path.split(path)
    if path in names or any(path.startswith(w) for w in whole):
      continue
    if base == "__init__.py" and folder + "/" in names | {os.path.dirname(n) + "/" for n in names}:
      continue
    absent.append(path)
  # Folders: each one holding files is listed, or one of its files is (a path below a folder names it too).
  folders = {os.path.dirname(p) + "/" for p in repository_files()}
  unnamed = sorted(f for f in folders
                   if not any(n.startswith(f) for n in names) and not any(f.startswith(w) for w in whole))
  assert not absent and not unnamed, (
      "docs/architecture.md's tree leaves out (add a line for each, with what it is):\n  "
      + "\n  ".join(absent + unnamed))


def test_the_tree_reads_as_its_rules_say():
  listed = dict(entries())
  assert listed["csrc/contract/contract.h"] is False and "csrc/contract/contract.cc" in listed
  assert "jax_mosaic_ffi/cuda/nvrtc/compiler.py" in listed
  assert listed["jax_mosaic_ffi/include/jmf_compat/"] is True  # a folder listed whole
  assert listed["jax_mosaic_ffi/cuda/"] is False
