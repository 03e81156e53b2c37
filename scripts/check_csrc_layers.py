#!/usr/bin/env python3
"""Checks the layers of csrc/: every #include stays in its own folder or goes down, and no header
includes itself through others.

  contract <- driver <- ffi <- peers <- runtime <- python

A file in one of these folders may include project headers (always written
"folder/name.h", from csrc/) of its own folder and the ones before it in
LAYERS, and the outside headers its layer allows; anything else, or a file
outside these folders, fails. Each folder's principal header (PRINCIPAL)
states its rule at its top, under a "// ===== csrc/<folder>/: ..." banner,
with the whole order of the layers (docs/architecture.md has the picture).
Standard library only, so scripts/lint.sh runs it anywhere:

  python3 scripts/check_csrc_layers.py [repo root]
"""

import pathlib
import re
import sys

# Bottom first. A layer sees its own folder and every folder before it.
LAYERS = ["contract", "driver", "ffi", "peers", "runtime", "python"]

# What each layer may include from outside csrc/, beyond the C++ standard
# library (<name> without a dot or slash), which every layer may use.
#   "system": other <...> headers (POSIX: <dlfcn.h>, <sys/mman.h>...)
#   a string ending in "/": "..." or <...> includes under that prefix; else that one header.
OUTSIDE = {
    "contract": set(),
    "driver": {"system", "cuda.h"},
    "ffi": {"system", "cuda.h", "xla/ffi/api/"},
    "peers": {"system", "cuda.h", "xla/ffi/api/"},
    "runtime": {"system", "cuda.h", "xla/ffi/api/"},
    "python": {"system", "cuda.h", "xla/ffi/api/", "nanobind/"},
}

# The file at whose top each folder states its rule.
PRINCIPAL = {
    "contract": "contract.h",
    "driver": "cuda_driver.h",
    "ffi": "status.h",
    "peers": "collective.h",
    "runtime": "handlers.h",
    "python": "python_module.cc",
}

# Libraries a layer must be allowed by name (above): "system" does not cover them.
LIBRARIES = ("xla/", "nanobind/", "cuda", "Python.h", "pybind11/", "absl/", "tsl/")

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def _outside_allowed(layer: str, bracket: str, name: str) -> bool:
  allowed = OUTSIDE[layer]
  for rule in allowed:
    if rule.endswith("/") and name.startswith(rule):
      return True
  if name in allowed:
    return True
  if bracket == "<":
    if "." not in name and "/" not in name:
      return True  # the C++ standard library
    return "system" in allowed and not name.startswith(LIBRARIES)
  return False


def check(root: pathlib.Path) -> list[str]:
  csrc = root / "csrc"
  problems = []
  for path in sorted(p for p in csrc.rglob("*") if p.is_file()):
    rel = path.relative_to(csrc)
    shown = f"csrc/{rel}"
    if len(rel.parts) != 2 or rel.parts[0] not in LAYERS:
      problems.append(f"{shown}: outside the layer folders csrc/{{{','.join(LAYERS)}}}/")
      continue
    layer = rel.parts[0]
    rank = LAYERS.index(layer)
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
      match = INCLUDE.match(line)
      if not match:
        continue
      bracket, name = match.groups()
      where = f"{shown}:{number}: #include {bracket}{name}{'>' if bracket == '<' else bracket}"
      folder = name.split("/", 1)[0] if "/" in name else None
      if bracket == '"' and folder in LAYERS:
        if ".." in name.split("/"):
          problems.append(f"{where}: no '..' in include paths")
        elif LAYERS.index(folder) > rank:
          problems.append(f"{where}: {layer}/ may not include from {folder}/, a layer above it "
                          f"({' <- '.join(LAYERS)})")
        elif not (csrc / name).is_file():
          problems.append(f"{where}: no such file in csrc/")
      elif not _outside_allowed(layer, bracket, name):
        if bracket == '"' and (csrc / layer / name).is_file():
          problems.append(f'{where}: name it from csrc/: #include "{layer}/{name}"')
        else:
          problems.append(f"{where}: {layer}/ may not include this (csrc/{layer}/'s principal header "
                          "states what it may use)")
  return problems


def rules_stated(root: pathlib.Path) -> list[str]:
  """Each folder's principal header opens with its banner and names the order of the layers."""
  problems = []
  order = " <- ".join(LAYERS)
  for layer in LAYERS:
    path = root / "csrc" / layer / PRINCIPAL[layer]
    shown = f"csrc/{layer}/{PRINCIPAL[layer]}"
    if not path.is_file():
      problems.append(f"{shown}: missing; it states the rule of csrc/{layer}/ (PRINCIPAL)")
      continue
    lines = path.read_text(errors="replace").splitlines()
    comment = []
    for line in lines:
      if not line.startswith("//"):
        break
      comment.append(line[2:].strip())
    if not lines or not lines[0].startswith(f"// ===== csrc/{layer}/:"):
      problems.append(f'{shown}:1: the folder\'s rule opens the file, under "// ===== csrc/{layer}/: ... ====="')
    elif order not in " ".join(comment):
      problems.append(f"{shown}: its opening comment names the layers in order: {order}")
  return problems


def cycles(root: pathlib.Path) -> list[str]:
  """Include circles among csrc/'s headers, each as "a.h -> b.h -> a.h"."""
  csrc = root / "csrc"
  graph = {}
  for path in csrc.rglob("*.h"):
    name = str(path.relative_to(csrc))
    graph[name] = [m.group(2) for line in path.read_text(errors="replace").splitlines()
                   if (m := INCLUDE.match(line)) and m.group(1) == '"' and (csrc / m.group(2)).is_file()]
  found, done = [], set()

  def visit(node, stack):
    if node in stack:
      found.append(" -> ".join(stack[stack.index(node):] + [node]))
      return
    if node in done:
      return
    for child in graph.get(node, []):
      visit(child, stack + [node])
    done.add(node)

  for node in sorted(graph):
    visit(node, [])
  return [f"csrc/: include circle {circle}" for circle in found]


def main() -> int:
  root = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parent.parent
  problems = check(root) + rules_stated(root) + cycles(root)
  for problem in problems:
    print(problem, file=sys.stderr)
  if problems:
    print(f"csrc layers: {len(problems)} problem(s)", file=sys.stderr)
    return 1
  print("csrc layers: every include stays in its folder or goes down, and none goes round")
  return 0


if __name__ == "__main__":
  sys.exit(main())
